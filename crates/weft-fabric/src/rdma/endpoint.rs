//! A connected RC endpoint: two-sided messages under credits, and one-sided RDMA READ/WRITE.
//!
//! Credits: this side pre-posts `recv_credits` receive buffers of `msg_bytes_max` bytes; the peer may have at most
//! that many messages in flight towards us. Every message header returns the receives re-posted since the last
//! message; when enough pile up without outgoing traffic, a credit-only message carries them. Messages that arrive
//! while this side waits for a credit are kept (their buffers stay un-posted, so the queue is bounded by
//! `recv_credits`) and handed out by the next [`Endpoint::recv`].

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ffi::{self, IbvQpAttr, IbvRecvWr, IbvSendWr, IbvSge, IbvWc};
use super::verbs::{CompChannel, Cq, Device, DeviceInner, EXTRA_FDS_MAX, MemoryRegion, Qp, RemoteRegion};
use super::wire::{
    self, CONN_INFO_BYTES, ConnInfo, FLAG_CREDIT_ONLY, MSG_BYTES_MAX_LIMIT, MSG_HEADER_BYTES, RECV_CREDITS_MAX,
};
use super::{RdmaError, Result};

/// Sizes and limits of an endpoint.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// Receives pre-posted: the peer's send credits.
    pub recv_credits: u32,
    /// Largest message this side accepts, header included (size of each receive buffer).
    pub msg_bytes_max: u32,
    /// Messages this side may have in its send queue at once (size of the registered send ring).
    pub send_slots: u32,
    /// Largest single RDMA READ/WRITE work request; bigger transfers are chopped and pipelined.
    pub transfer_unit_bytes: usize,
    /// How long a wait for a completion or a message may take before it fails.
    pub timeout_ms: u64,
    /// Sleep on a completion channel instead of busy-polling (servers may poll, clients wait on
    /// events). Costs a system call or two per wait, saves a core.
    pub evented: bool,
    /// The peer may RDMA READ and WRITE through this queue pair (into memory registered for it). Only the client's
    /// transfer QP needs it: the server initiates every transfer, so its QPs (and all message QPs) refuse them.
    pub remote_access: bool,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            recv_credits: 16,
            msg_bytes_max: 4096 + MSG_HEADER_BYTES as u32,
            send_slots: 16,
            transfer_unit_bytes: 1 << 20,
            timeout_ms: 30_000,
            evented: false,
            remote_access: true,
        }
    }
}

const WR_KIND_SHIFT: u32 = 62;
const WR_SEND: u64 = 1 << WR_KIND_SHIFT;
const WR_RDMA: u64 = 2 << WR_KIND_SHIFT;
const WR_SEQ_MASK: u64 = (1 << WR_KIND_SHIFT) - 1;

/// A connected RC queue pair with its completion queues and message buffers.
pub struct Endpoint {
    // Field order is drop order: the QP goes before the CQs it uses, the CQs before their channel, the rings
    // after the QP stops using them.
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    channel: Option<CompChannel>,
    /// Whether each CQ is armed for an event (evented mode).
    send_armed: bool,
    recv_armed: bool,
    recv_ring: MemoryRegion,
    send_ring: MemoryRegion,
    dev: Device,
    cfg: EndpointConfig,
    peer: ConnInfo,
    /// Messages the peer can still take (its posted receives we have not used).
    send_credits: u32,
    /// Receives re-posted since our last message: owed to the peer.
    credits_owed: u32,
    /// Received, decoded, not yet handed out: (slot, payload length).
    ready: VecDeque<(usize, usize)>,
    send_slot_next: usize,
    /// Signaled sends and RDMA work requests posted and not yet completed.
    sends_outstanding: u32,
    rdma_outstanding: u32,
    next_seq: u64,
    /// Highest RDMA sequence number whose completion was reaped (RC completes a send queue in order).
    rdma_done_seq: u64,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("device", &self.dev)
            .field("qpn", &self.qp.qpn)
            .field("peer_qpn", &self.peer.qpn)
            .field("send_credits", &self.send_credits)
            .field("evented", &self.channel.is_some())
            .finish()
    }
}

fn psn_seed() -> u32 {
    // Not security: a fresh starting PSN per connection keeps stale packets of an old QP from matching.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos());
    (nanos.unwrap_or(0) ^ std::process::id().rotate_left(12)) & 0x00ff_ffff
}

impl Endpoint {
    /// Connects to `addr` (the peer's TCP side channel) and brings up an RC connection.
    pub fn connect(dev: &Device, addr: &str, cfg: EndpointConfig) -> Result<Self> {
        let mut stream = TcpStream::connect(addr)?;
        Self::over_tcp(dev, &mut stream, cfg)
    }

    /// Accepts one side-channel connection and brings up an RC connection over it.
    pub fn accept(dev: &Device, listener: &std::net::TcpListener, cfg: EndpointConfig) -> Result<Self> {
        let (mut stream, _) = listener.accept()?;
        Self::over_tcp(dev, &mut stream, cfg)
    }

    /// Brings up an RC connection: create the QP, pre-post receives, swap [`ConnInfo`] over `stream`, move to
    /// RTS, and wait until the peer is at RTS too (so no message reaches a QP that cannot take it yet).
    pub fn over_tcp(dev: &Device, stream: &mut TcpStream, cfg: EndpointConfig) -> Result<Self> {
        if !(1..=RECV_CREDITS_MAX).contains(&cfg.recv_credits)
            || cfg.msg_bytes_max <= MSG_HEADER_BYTES as u32
            || cfg.msg_bytes_max > MSG_BYTES_MAX_LIMIT
            || cfg.send_slots == 0
            || cfg.transfer_unit_bytes == 0
        {
            return Err(RdmaError::Protocol(format!("invalid endpoint configuration {cfg:?}")));
        }
        let timeout = Duration::from_millis(cfg.timeout_ms.max(1));
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;

        let inner: &Arc<DeviceInner> = &dev.inner;
        let rdma_depth = u32::from(inner.max_rd_atomic).max(1);
        let send_wr = cfg.send_slots + rdma_depth;
        let channel = if cfg.evented { Some(CompChannel::new(inner)?) } else { None };
        let send_cq = Cq::new(inner, send_wr, channel.as_ref())?;
        let recv_cq = Cq::new(inner, cfg.recv_credits, channel.as_ref())?;
        let qp = Qp::new_rc(inner, &send_cq, &recv_cq, send_wr, cfg.recv_credits)?;
        let mut attr = IbvQpAttr {
            qp_state: ffi::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: inner.port,
            qp_access_flags: if cfg.remote_access {
                (ffi::IBV_ACCESS_REMOTE_READ | ffi::IBV_ACCESS_REMOTE_WRITE) as u32
            } else {
                0
            },
            ..IbvQpAttr::default()
        };
        qp.modify(
            &mut attr,
            ffi::IBV_QP_STATE | ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT | ffi::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(INIT)",
        )?;
        let recv_ring = MemoryRegion::new(dev, cfg.recv_credits as usize * cfg.msg_bytes_max as usize, false, false)?;

        let local = ConnInfo {
            lid: inner.port_attr.lid,
            qpn: qp.qpn,
            psn: psn_seed(),
            gid: inner.gid,
            mtu: inner.port_attr.active_mtu,
            recv_credits: cfg.recv_credits,
            msg_bytes_max: cfg.msg_bytes_max,
        };
        stream.write_all(&local.encode())?;
        let mut buf = [0u8; CONN_INFO_BYTES];
        stream.read_exact(&mut buf)?;
        let peer = ConnInfo::decode(&buf)?;

        // The send ring's slots hold the largest message the peer accepts.
        let send_ring = MemoryRegion::new(dev, cfg.send_slots as usize * peer.msg_bytes_max as usize, false, false)?;
        let mut ep = Self {
            qp,
            send_cq,
            recv_cq,
            channel,
            send_armed: false,
            recv_armed: false,
            recv_ring,
            send_ring,
            dev: dev.clone(),
            send_credits: peer.recv_credits,
            credits_owed: 0,
            ready: VecDeque::new(),
            send_slot_next: 0,
            sends_outstanding: 0,
            rdma_outstanding: 0,
            next_seq: 0,
            rdma_done_seq: 0,
            peer,
            cfg,
        };
        for slot in 0..ep.cfg.recv_credits as usize {
            ep.post_recv(slot)?;
        }
        ep.ready_to_send(&local)?;
        // Barrier: one byte each way once at RTS.
        stream.write_all(&[1])?;
        let mut ready = [0u8; 1];
        stream.read_exact(&mut ready)?;
        if ready[0] != 1 {
            return Err(RdmaError::Protocol(format!("peer sent {:#x} instead of its ready byte", ready[0])));
        }
        Ok(ep)
    }

    fn ready_to_send(&mut self, local: &ConnInfo) -> Result<()> {
        let inner = &self.dev.inner;
        let peer = &self.peer;
        let mut ah =
            ffi::IbvAhAttr { dlid: peer.lid, sl: 0, src_path_bits: 0, port_num: inner.port, ..Default::default() };
        // RoCE has no LIDs: address the peer by GID (GRH). On InfiniBand a LID suffices within a subnet.
        if inner.port_attr.link_layer == ffi::IBV_LINK_LAYER_ETHERNET || peer.lid == 0 {
            ah.is_global = 1;
            ah.grh = ffi::IbvGlobalRoute {
                dgid: peer.gid,
                flow_label: 0,
                sgid_index: inner.gid_index,
                hop_limit: 64,
                traffic_class: 0,
            };
        }
        let mut attr = IbvQpAttr {
            qp_state: ffi::IBV_QPS_RTR,
            path_mtu: local.mtu.min(peer.mtu),
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: inner.max_dest_rd_atomic,
            min_rnr_timer: 12,
            ah_attr: ah,
            ..IbvQpAttr::default()
        };
        self.qp.modify(
            &mut attr,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_AV
                | ffi::IBV_QP_PATH_MTU
                | ffi::IBV_QP_DEST_QPN
                | ffi::IBV_QP_RQ_PSN
                | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                | ffi::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp(RTR)",
        )?;
        let mut attr = IbvQpAttr {
            qp_state: ffi::IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: local.psn,
            max_rd_atomic: inner.max_rd_atomic,
            ..IbvQpAttr::default()
        };
        self.qp.modify(
            &mut attr,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_TIMEOUT
                | ffi::IBV_QP_RETRY_CNT
                | ffi::IBV_QP_RNR_RETRY
                | ffi::IBV_QP_SQ_PSN
                | ffi::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp(RTS)",
        )
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The largest payload [`Endpoint::send`] takes (the peer's receive buffer minus the header).
    pub fn payload_bytes_max(&self) -> usize {
        self.peer.msg_bytes_max as usize - MSG_HEADER_BYTES
    }

    fn post_recv(&mut self, slot: usize) -> Result<()> {
        let size = self.cfg.msg_bytes_max as usize;
        let mut sge = IbvSge {
            addr: self.recv_ring.addr() + (slot * size) as u64,
            length: size as u32,
            lkey: self.recv_ring.lkey(),
        };
        let mut wr = IbvRecvWr { wr_id: slot as u64, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let inner = &self.dev.inner;
        // SAFETY: the QP is live on inner.ctx; the SGE lies inside recv_ring (slot < recv_credits), which outlives
        // the QP (field order) and is not handed out while posted.
        let rc = unsafe { inner.verbs.post_recv(inner.ctx, self.qp.ptr, &mut wr) };
        if rc != 0 {
            return Err(RdmaError::Verbs { op: "ibv_post_recv", errno: rc });
        }
        Ok(())
    }

    fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_millis(self.cfg.timeout_ms)
    }

    /// Called when a poll found nothing: spin (polled mode) or sleep on the completion channel (evented mode).
    /// Either way the caller polls again afterwards.
    fn wait(&mut self, deadline: Instant, spins: &mut u32, op: &'static str) -> Result<()> {
        if self.channel.is_none() {
            return self.check_deadline(deadline, spins, op);
        }
        let now = Instant::now();
        // Only a wait that could sleep can time out: the arming calls return at once.
        if self.send_armed && self.recv_armed && now > deadline {
            return Err(RdmaError::Timeout { op, timeout_ms: self.cfg.timeout_ms });
        }
        self.wait_event(&[], deadline.saturating_duration_since(now)).map(|_| ())
    }

    /// The completion channel's fd in evented mode: readable when a completion event is pending (for an event
    /// loop such as tokio's `AsyncFd`).
    pub fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        self.channel.as_ref().map(CompChannel::fd)
    }

    fn check_deadline(&self, deadline: Instant, spins: &mut u32, op: &'static str) -> Result<()> {
        *spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            if Instant::now() > deadline {
                return Err(RdmaError::Timeout { op, timeout_ms: self.cfg.timeout_ms });
            }
            // Busy-polling shares the CPU with the peer on small machines; give it a turn.
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// Reaps send-queue completions; returns how many were reaped. Any error status fails the endpoint's op.
    fn reap_send(&mut self) -> Result<usize> {
        let mut wc = [IbvWc::default(); 16];
        let n = self.send_cq.poll(&mut wc)?;
        for c in &wc[..n] {
            let kind = c.wr_id & !WR_SEQ_MASK;
            if c.status != ffi::IBV_WC_SUCCESS {
                let op = if kind == WR_RDMA { "rdma read/write" } else { "send" };
                return Err(RdmaError::Completion { op, status: c.status, text: self.send_cq.status_text(c.status) });
            }
            if kind == WR_RDMA {
                self.rdma_outstanding -= 1;
                self.rdma_done_seq = self.rdma_done_seq.max(c.wr_id & WR_SEQ_MASK);
            } else {
                self.sends_outstanding -= 1;
            }
        }
        Ok(n)
    }

    /// Polls the receive queue once: decodes arrived messages, takes their credits, queues the rest.
    fn reap_recv(&mut self) -> Result<usize> {
        let mut wc = [IbvWc::default(); 16];
        let n = self.recv_cq.poll(&mut wc)?;
        let size = self.cfg.msg_bytes_max as usize;
        for c in &wc[..n] {
            if c.status != ffi::IBV_WC_SUCCESS {
                return Err(RdmaError::Completion {
                    op: "recv",
                    status: c.status,
                    text: self.recv_cq.status_text(c.status),
                });
            }
            let slot = usize::try_from(c.wr_id).unwrap_or(usize::MAX);
            if slot >= self.cfg.recv_credits as usize {
                return Err(RdmaError::Protocol(format!("receive completion for unknown slot {}", c.wr_id)));
            }
            let buf = &self.recv_ring.as_slice()[slot * size..(slot + 1) * size];
            // The peer can never hold more of our credits than we own in total.
            let header = wire::decode_header(buf, c.byte_len as usize, self.peer.recv_credits)?;
            self.send_credits = (self.send_credits + u32::from(header.credits)).min(self.peer.recv_credits);
            if header.flags & FLAG_CREDIT_ONLY != 0 {
                self.post_recv(slot)?;
                self.credits_owed += 1;
            } else {
                self.ready.push_back((slot, header.payload_len));
            }
        }
        Ok(n)
    }

    /// Sends one message (copied into the registered send ring; at most [`Endpoint::payload_bytes_max`] bytes).
    /// Waits for a credit and a free send slot; returns once posted.
    pub fn send(&mut self, payload: &[u8]) -> Result<()> {
        if payload.is_empty() || payload.len() > self.payload_bytes_max() {
            return Err(RdmaError::TooLarge { len: payload.len(), max: self.payload_bytes_max() });
        }
        self.send_inner(payload, 0)
    }

    fn send_inner(&mut self, payload: &[u8], flags: u16) -> Result<()> {
        let deadline = self.deadline();
        let mut spins = 0;
        while self.send_credits == 0 || self.sends_outstanding >= self.cfg.send_slots {
            let progress = self.reap_send()? + self.reap_recv()?;
            if progress == 0 {
                self.wait(deadline, &mut spins, "send (waiting for a credit)")?;
            }
        }
        let slot_bytes = self.peer.msg_bytes_max as usize;
        let slot = self.send_slot_next;
        self.send_slot_next = (slot + 1) % self.cfg.send_slots as usize;
        // Return everything owed (a u16 on the wire; credits never exceed RECV_CREDITS_MAX).
        let credits = u16::try_from(self.credits_owed).unwrap_or(u16::MAX);
        let msg_len = MSG_HEADER_BYTES + payload.len();
        {
            let ring = &mut self.send_ring.as_mut_slice()[slot * slot_bytes..slot * slot_bytes + msg_len];
            wire::encode_header(ring, payload.len() as u32, credits, flags);
            ring[MSG_HEADER_BYTES..].copy_from_slice(payload);
        }
        let mut sge = IbvSge {
            addr: self.send_ring.addr() + (slot * slot_bytes) as u64,
            length: msg_len as u32,
            lkey: self.send_ring.lkey(),
        };
        self.next_seq += 1;
        let mut wr = send_wr(WR_SEND | self.next_seq, &mut sge, ffi::IBV_WR_SEND, 0, 0);
        let inner = &self.dev.inner;
        // SAFETY: the QP is live; the SGE lies in send_ring, whose slot is not reused until this completion is
        // reaped (sends_outstanding < send_slots, completions in order).
        let rc = unsafe { inner.verbs.post_send(inner.ctx, self.qp.ptr, &mut wr) };
        if rc != 0 {
            return Err(RdmaError::Verbs { op: "ibv_post_send(SEND)", errno: rc });
        }
        self.sends_outstanding += 1;
        self.send_credits -= 1;
        self.credits_owed -= u32::from(credits);
        Ok(())
    }

    /// Sends one message if a credit and a send slot are free right now; `Ok(false)` (nothing sent) otherwise.
    /// Never waits: for a thread that also has to keep receiving (the `rdma` fabric's message pump).
    pub fn try_send(&mut self, payload: &[u8]) -> Result<bool> {
        if payload.is_empty() || payload.len() > self.payload_bytes_max() {
            return Err(RdmaError::TooLarge { len: payload.len(), max: self.payload_bytes_max() });
        }
        self.reap_send()?;
        self.reap_recv()?;
        if self.send_credits == 0 || self.sends_outstanding >= self.cfg.send_slots {
            return Ok(false);
        }
        self.send_inner(payload, 0)?;
        Ok(true)
    }

    /// Hands the next message that has arrived to `f` in place, if there is one; never waits. Returns credits
    /// as [`Endpoint::recv`] does, but only when that cannot block.
    pub fn try_recv<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        if self.ready.is_empty() {
            self.reap_recv()?;
            self.reap_send()?;
        }
        let Some((slot, len)) = self.ready.pop_front() else {
            return Ok(None);
        };
        let size = self.cfg.msg_bytes_max as usize;
        let start = slot * size + MSG_HEADER_BYTES;
        let out = f(&self.recv_ring.as_slice()[start..start + len]);
        self.post_recv(slot)?;
        self.credits_owed += 1;
        if self.credits_owed >= (self.cfg.recv_credits / 2).max(1)
            && self.send_credits > 1
            && self.sends_outstanding < self.cfg.send_slots
        {
            self.send_inner(&[], FLAG_CREDIT_ONLY)?;
        }
        Ok(Some(out))
    }

    /// Evented endpoints: sleeps until a completion event, one of `extra` becomes readable, or `timeout` passes.
    /// The first calls only arm the completion queues and return at once, because a completion that landed before
    /// the arm raises no event: the caller polls (`try_send`/`try_recv`) after every return, then calls again.
    /// Returns which of `extra` are readable.
    /// At most [`EXTRA_FDS_MAX`] extra descriptors.
    pub fn wait_event(&mut self, extra: &[std::os::fd::RawFd], timeout: Duration) -> Result<[bool; EXTRA_FDS_MAX]> {
        let Some(channel) = &self.channel else {
            return Err(RdmaError::Protocol("wait_event needs an evented endpoint".into()));
        };
        if !self.send_armed {
            self.send_cq.arm()?;
            self.send_armed = true;
            return Ok([false; EXTRA_FDS_MAX]);
        }
        if !self.recv_armed {
            self.recv_cq.arm()?;
            self.recv_armed = true;
            return Ok([false; EXTRA_FDS_MAX]);
        }
        let (cq, ready) = channel.wait_with(extra, timeout)?;
        match cq {
            Some(cq) if cq == self.send_cq.ptr => self.send_armed = false,
            Some(_) => self.recv_armed = false,
            None => {}
        }
        Ok(ready)
    }

    /// Waits for the next message and hands its payload to `f` in place (no copy); the receive buffer is
    /// re-posted when `f` returns.
    pub fn recv<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let deadline = self.deadline();
        let mut spins = 0;
        let (slot, len) = loop {
            if let Some(next) = self.ready.pop_front() {
                break next;
            }
            // Keep the send queue drained while we wait, so its slots free up.
            let progress = self.reap_recv()? + self.reap_send()?;
            if progress == 0 {
                self.wait(deadline, &mut spins, "recv")?;
            }
        };
        let size = self.cfg.msg_bytes_max as usize;
        let start = slot * size + MSG_HEADER_BYTES;
        let out = f(&self.recv_ring.as_slice()[start..start + len]);
        self.post_recv(slot)?;
        self.credits_owed += 1;
        // Nothing else may be going out soon: hand back a batch of credits before the peer runs dry.
        if self.credits_owed >= (self.cfg.recv_credits / 2).max(1) && self.send_credits > 1 {
            self.send_inner(&[], FLAG_CREDIT_ONLY)?;
        }
        Ok(out)
    }

    /// RDMA READ: copies the peer's `remote` chunk into `local[local_offset..]` without the peer's CPU. Returns
    /// once every byte has landed.
    pub fn read(&mut self, local: &mut MemoryRegion, local_offset: usize, remote: &RemoteRegion) -> Result<()> {
        self.rdma(ffi::IBV_WR_RDMA_READ, local, local_offset, std::slice::from_ref(remote))
    }

    /// RDMA WRITE: copies `local[local_offset..]` into the peer's `remote` chunk. Returns once the writes have
    /// completed at this side; a message sent afterwards reaches the peer after the data (RC ordering), so the
    /// reply doubles as the peer's completion.
    pub fn write(&mut self, local: &MemoryRegion, local_offset: usize, remote: &RemoteRegion) -> Result<()> {
        self.rdma(ffi::IBV_WR_RDMA_WRITE, local, local_offset, std::slice::from_ref(remote))
    }

    /// [`Endpoint::read`] of a chunk list: the chunks, in order, land back to back from `local_offset`. All
    /// chunks share one pipeline, so a list of small chunks costs one round trip, not one per chunk.
    pub fn read_chunks(
        &mut self,
        local: &mut MemoryRegion,
        local_offset: usize,
        chunks: &[RemoteRegion],
    ) -> Result<()> {
        self.rdma(ffi::IBV_WR_RDMA_READ, local, local_offset, chunks)
    }

    /// [`Endpoint::read_chunks`] into a region shared with other threads (a server zone registered once): the
    /// chunks land back to back in `local` from `local_offset`.
    ///
    /// # Safety
    /// The caller has exclusive use of `local[local_offset..local_offset + total]` until this returns (no Rust
    /// reference to those bytes exists meanwhile), as it would through `&mut` on an owned region.
    pub unsafe fn read_chunks_shared(
        &mut self,
        local: &MemoryRegion,
        local_offset: usize,
        chunks: &[RemoteRegion],
    ) -> Result<()> {
        self.rdma(ffi::IBV_WR_RDMA_READ, local, local_offset, chunks)
    }

    /// [`Endpoint::write`] of a chunk list: `local` from `local_offset` is spread over the chunks in order.
    pub fn write_chunks(&mut self, local: &MemoryRegion, local_offset: usize, chunks: &[RemoteRegion]) -> Result<()> {
        self.rdma(ffi::IBV_WR_RDMA_WRITE, local, local_offset, chunks)
    }

    /// Posts the transfer as work requests of at most `transfer_unit_bytes`, up to `max_rd_atomic` in flight, and
    /// waits for all of them. On an error the endpoint is unusable (its QP is in the error state or still has work
    /// in flight): drop it. Memory stays safe either way: a region is deregistered before it is unmapped, so late
    /// work fails at the device instead of touching freed memory.
    fn rdma(&mut self, opcode: u32, local: &MemoryRegion, local_offset: usize, chunks: &[RemoteRegion]) -> Result<()> {
        if !Arc::ptr_eq(&local.dev, &self.dev.inner) {
            return Err(RdmaError::Protocol("local region belongs to another device".into()));
        }
        let mut total = 0u64;
        for c in chunks {
            c.addr.checked_add(c.len).ok_or(RdmaError::OutOfBounds {
                what: "remote chunk",
                offset: c.addr,
                len: c.len,
                region_len: u64::MAX,
            })?;
            total = total.checked_add(c.len).ok_or(RdmaError::TooLarge { len: usize::MAX, max: local.len() })?;
        }
        let total = usize::try_from(total).map_err(|_| RdmaError::TooLarge { len: usize::MAX, max: local.len() })?;
        local.check("local buffer", local_offset, total)?;
        let op = if opcode == ffi::IBV_WR_RDMA_READ { "rdma read" } else { "rdma write" };
        let depth = u32::from(self.dev.inner.max_rd_atomic).max(1);
        let unit = self.cfg.transfer_unit_bytes;
        let deadline = self.deadline();
        let mut spins = 0;
        let mut local_at = local_offset;
        let mut last_seq = self.rdma_done_seq;
        for chunk in chunks {
            let len = chunk.len as usize; // fits: the sum fits in usize
            let mut done = 0usize;
            while done < len {
                // Keep up to `depth` units in flight: the pipeline that hides the round trip of each unit.
                while self.rdma_outstanding >= depth {
                    if self.reap_send()? == 0 {
                        self.wait(deadline, &mut spins, op)?;
                    }
                }
                let n = unit.min(len - done);
                let mut sge = IbvSge { addr: local.addr() + local_at as u64, length: n as u32, lkey: local.lkey() };
                self.next_seq += 1;
                last_seq = self.next_seq;
                let mut wr = send_wr(WR_RDMA | self.next_seq, &mut sge, opcode, chunk.addr + done as u64, chunk.rkey);
                let inner = &self.dev.inner;
                // SAFETY: the QP is live; the SGE lies inside `local` (checked above), which the caller borrows
                // until this function has reaped every completion of the transfer (or failed, see above).
                let rc = unsafe { inner.verbs.post_send(inner.ctx, self.qp.ptr, &mut wr) };
                if rc != 0 {
                    return Err(RdmaError::Verbs { op: "ibv_post_send(RDMA)", errno: rc });
                }
                self.rdma_outstanding += 1;
                done += n;
                local_at += n;
            }
        }
        while self.rdma_done_seq < last_seq {
            if self.reap_send()? == 0 {
                self.wait(deadline, &mut spins, op)?;
            }
        }
        Ok(())
    }
}

fn send_wr(wr_id: u64, sge: &mut IbvSge, opcode: u32, remote_addr: u64, rkey: u32) -> IbvSendWr {
    IbvSendWr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: sge,
        num_sge: 1,
        opcode,
        send_flags: ffi::IBV_SEND_SIGNALED,
        imm_data: 0,
        remote_addr,
        rkey,
        _wr_rest: [0; 5],
        _qp_type: 0,
        _tail: [0; 6],
    }
}
