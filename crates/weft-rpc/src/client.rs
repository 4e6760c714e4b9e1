//! The client side of a session: one connection at a time to one server, a reader task that matches replies to
//! slots, and calls that time out, reconnect and retry on the same (slot, sequence).
//!
//! Payloads never pass through an intermediate buffer: a call's outgoing data is written from the caller's
//! [`Bytes`] segments with one vectored write, and incoming data is read from the socket straight into the caller's
//! [`BytesMut`] segments, which the call takes by value and gives back (on success and on failure).
//!
//! With a credential (`ClientConfig::credential`), every connection runs the mutual challenge–response (auth.rs)
//! before anything else, and a reconnect re-binds the session to the new connection (`SessionBind`) before any
//! call uses it; a server that cannot prove the key is refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, BufReader};
use tokio::sync::{Semaphore, oneshot};
use tracing::{debug, warn};
use weft_fabric::{Connection, Fabric, Killer};
use weft_proto::UserCred;
use weft_proto::frame::{FLAG_ERROR, FLAG_ONCE, FLAG_USER};
use weft_proto::msg::RegionsReq;
use weft_proto::msg::{AuthBeginReq, AuthFinishReq, SessionBindReq, SessionCreateReq, decode};
use weft_proto::{Chunk, FrameKind, FrameLimits, Header, OnceTag, Op, Request, Response, WireError};

use crate::auth::{self, Nonces, Secret};
use crate::config::ClientConfig;
use crate::error::RpcError;
use crate::io::{read_head, skip, write_frame};
use crate::pin::{ChunkBuffers, Pinned, REGISTER_ATTEMPTS, RegCache};
use crate::retry::{Event, Next, Retry};

/// Slot number used for session control calls (create, destroy), which run outside the slot table.
const CONTROL_SLOT: u32 = u32::MAX;
const READ_BUFFER_BYTES: usize = 64 << 10;

type Outcome = Result<(Header, Vec<u8>, Vec<BytesMut>), (String, Vec<BytesMut>)>;

struct Pending {
    seq: u32,
    dest: Vec<BytesMut>,
    tx: oneshot::Sender<Outcome>,
}

struct Conn<F: Fabric> {
    /// Unique per process: registrations of client memory belong to one connection.
    id: u64,
    writer: tokio::sync::Mutex<F::Writer>,
    killer: F::Killer,
    /// Guarded together with `dead` so no call registers on a connection whose reader has already drained it.
    pending: Mutex<(bool, HashMap<u32, Pending>)>,
    dead: AtomicBool,
    /// The handshake's nonces, once authenticated (session secrets and bind proofs derive from them).
    nonces: std::sync::OnceLock<Nonces>,
}

impl<F: Fabric> Conn<F> {
    /// Registers a call; gives the buffers back if the connection is already dead.
    fn register(&self, slot: u32, seq: u32, dest: Vec<BytesMut>) -> Result<oneshot::Receiver<Outcome>, Vec<BytesMut>> {
        let mut p = self.pending.lock().expect("pending");
        if p.0 {
            return Err(dest);
        }
        let (tx, rx) = oneshot::channel();
        p.1.insert(slot, Pending { seq, dest, tx });
        Ok(rx)
    }

    fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.killer.kill();
    }

    /// Marks the connection dead and fails every registered call, giving back its buffers.
    fn fail_all(&self, reason: &str) {
        self.dead.store(true, Ordering::SeqCst);
        let drained: Vec<Pending> = {
            let mut p = self.pending.lock().expect("pending");
            p.0 = true;
            p.1.drain().map(|(_, v)| v).collect()
        };
        for p in drained {
            let _ = p.tx.send(Err((reason.to_string(), p.dest)));
        }
    }
}

static CONN_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

struct SlotSeq {
    session: u64,
    seq: u32,
    /// Calls made on this slot, over every session (the once block's `call`).
    calls: u64,
}

struct Inner<F: Fabric> {
    fabric: F,
    /// As given: one address, or several separated by commas (services of one store, tried in turn).
    addr: String,
    addrs: Vec<String>,
    /// Index in `addrs` of the address the live connection (or the next attempt) goes to.
    current: std::sync::atomic::AtomicUsize,
    cfg: ClientConfig,
    conn: tokio::sync::Mutex<Option<Arc<Conn<F>>>>,
    /// Serialises session control calls.
    control: tokio::sync::Mutex<()>,
    session: Mutex<u64>,
    /// The secret of the session it was derived for (with a credential), proving ownership on a reconnect.
    session_secret: Mutex<Option<(u64, Secret)>>,
    slots: Vec<Mutex<SlotSeq>>,
    /// This client instance in once blocks (random, not 0).
    instance: u64,
    free: Mutex<Vec<u32>>,
    credits: Semaphore,
    /// Client memory registered on the current connection (pin-down cache), and the lock its misses take.
    regs: Arc<Mutex<RegCache>>,
    reg_lock: tokio::sync::Mutex<()>,
    /// Attempts sent again on this session (what `metrics::CLIENT.retries` counts for the whole process).
    resends: std::sync::atomic::AtomicU64,
}

impl<F: Fabric> Drop for Inner<F> {
    fn drop(&mut self) {
        if let Ok(c) = self.conn.try_lock()
            && let Some(c) = c.as_ref()
        {
            c.kill();
        }
    }
}

/// A session with one server. Cheap to clone; clones share the session and its slots.
pub struct RpcClient<F: Fabric> {
    inner: Arc<Inner<F>>,
}

impl<F: Fabric> Clone for RpcClient<F> {
    fn clone(&self) -> Self {
        RpcClient { inner: self.inner.clone() }
    }
}

/// Returns a slot to the free list when a call ends, however it ends.
struct SlotGuard<'a> {
    free: &'a Mutex<Vec<u32>>,
    slot: u32,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.free.lock().expect("free slots").push(self.slot);
    }
}

/// A request as it goes out on every attempt: encoded once.
struct Outgoing<'a> {
    op: Op,
    flags: u8,
    body: &'a [u8],
    body_crc: u32,
    data: &'a [&'a [u8]],
    data_len: u32,
}

impl<F: Fabric> RpcClient<F> {
    /// Connects and opens a session. `addr` may name several servers of one service, separated by commas: the
    /// first that answers is used, and a lost connection moves on to the next (with
    /// `ClientConfig::failover_timeout_ms`, calls wait for one to answer).
    pub async fn connect(fabric: F, addr: &str, cfg: ClientConfig) -> Result<Self, RpcError> {
        let addrs = split_addrs(addr);
        if addrs.is_empty() {
            let source = std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address given");
            return Err(RpcError::Connect { addr: addr.to_string(), source });
        }
        let (current, conn) = open_any(&fabric, &addrs, 0, &cfg).await?;
        let (session, granted, secret) = create_session(&conn, addr, &cfg).await?;
        let cfg_regs = cfg.registrations_max;
        debug!(addr, session = format_args!("{session:#x}"), slots = granted, "session open");
        Ok(RpcClient {
            inner: Arc::new(Inner {
                fabric,
                addr: addr.to_string(),
                addrs,
                current: std::sync::atomic::AtomicUsize::new(current),
                slots: (0..granted).map(|_| Mutex::new(SlotSeq { session, seq: 0, calls: 0 })).collect(),
                instance: crate::auth::random_id(),
                free: Mutex::new((0..granted).rev().collect()),
                credits: Semaphore::new(granted as usize),
                cfg,
                conn: tokio::sync::Mutex::new(Some(conn)),
                control: tokio::sync::Mutex::new(()),
                session: Mutex::new(session),
                session_secret: Mutex::new(secret.map(|s| (session, s))),
                regs: Arc::new(Mutex::new(RegCache::new(cfg_regs))),
                reg_lock: tokio::sync::Mutex::new(()),
                resends: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    /// The address(es) as given to [`RpcClient::connect`].
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// Attempts this client sent again (a lost connection, a busy or failed-over server), since it connected.
    pub fn resends(&self) -> u64 {
        self.inner.resends.load(Ordering::Relaxed)
    }

    /// The address the live connection goes to (one of those given).
    pub fn current_addr(&self) -> &str {
        &self.inner.addrs[self.inner.current.load(Ordering::SeqCst)]
    }

    /// Slots granted by the server: the most calls this client has in flight to it.
    pub fn slots(&self) -> usize {
        self.inner.slots.len()
    }

    /// The session this client holds at the server now (it changes only when the server lost the old one).
    pub fn session_id(&self) -> u64 {
        *self.inner.session.lock().expect("session")
    }

    /// `Null` outside the slots: shows the server this connection is alive. Through a slot it would break the
    /// slot's sequence: the server answers `Null` before admission (it needs no session), so the number it took
    /// would never reach the slot's record and the slot's next call would be refused as misordered.
    pub async fn ping(&self) -> Result<(), RpcError> {
        self.control_call(Request::Null(())).await.map(|_| ())
    }

    /// Ends the session politely (best effort).
    pub async fn close(&self) {
        let _ = self.control_call(Request::SessionDestroy(())).await;
        if let Some(c) = self.inner.conn.lock().await.take() {
            c.kill();
        }
    }

    /// A call without payloads.
    pub async fn call_simple(&self, req: Request) -> Result<Response, RpcError> {
        self.call(req, Vec::new(), Vec::new()).await.map(|(r, _)| r)
    }

    /// A call without payloads on behalf of `user`: the request carries its user block (flag `FLAG_USER`,
    /// docs/format.md §1), which the server's service interprets under the key this connection proved. A
    /// retransmission carries the same block.
    pub async fn call_simple_as(&self, user: Option<&UserCred>, req: Request) -> Result<Response, RpcError> {
        self.call_on(req, user, Vec::new(), Vec::new(), None).await.map(|(r, _)| r)
    }

    /// Sends `req` with `data` as its payload and receives the reply's payload into `dest`, whose segments'
    /// lengths must add up to exactly the payload the reply carries. `dest` comes back with the response.
    pub async fn call(
        &self,
        req: Request,
        data: Vec<Bytes>,
        dest: Vec<BytesMut>,
    ) -> Result<(Response, Vec<BytesMut>), RpcError> {
        self.call_on(req, None, data, dest, None).await
    }

    /// What the fabric to this server can do.
    pub fn capabilities(&self) -> weft_fabric::Capabilities {
        self.inner.fabric.capabilities_of(self.current_addr())
    }

    /// The client's pre-registered arena, on a one-sided fabric.
    pub fn arena(&self) -> Option<Arc<weft_fabric::Arena>> {
        if self.capabilities().one_sided { self.inner.fabric.arena() } else { None }
    }

    /// As [`RpcClient::call`]; with `require_conn`, the request may only go out on that connection (its chunks
    /// name regions registered there): on any other it fails with `RegionsLost` (or `MaybeApplied` if an
    /// attempt of a non-idempotent op went out before the connection changed).
    ///
    /// Makes one attempt at a time on the call's (slot, sequence); the retry machine ([`Retry`]) decides what
    /// follows a failed one.
    async fn call_on(
        &self,
        req: Request,
        user: Option<&UserCred>,
        data: Vec<Bytes>,
        dest: Vec<BytesMut>,
        require_conn: Option<u64>,
    ) -> Result<(Response, Vec<BytesMut>), RpcError> {
        let inner = &*self.inner;
        let op = req.op();
        let mut body = Vec::new();
        if let Some(u) = user {
            u.encode_into(&mut body).map_err(|e| RpcError::Protocol { addr: inner.addr.clone(), source: e.into() })?;
        }
        let data_len: usize = data.iter().map(|d| d.len()).sum();
        assert!(data_len <= u32::MAX as usize, "payload of {data_len} bytes does not fit a frame");
        let data_slices: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();

        let _credit = inner.credits.acquire().await.expect("credits are never closed");
        let slot = inner.free.lock().expect("free slots").pop().expect("a credit guarantees a free slot");
        let _guard = SlotGuard { free: &inner.free, slot };
        let (mut sid, mut seq) = self.next_seq(slot);
        // Every attempt of this call, in whatever session, carries the same once block.
        let once = inner.cfg.once_tags && !op.is_idempotent();
        if once {
            OnceTag { client: inner.instance, call: self.next_call(slot) }.encode_into(&mut body);
        }
        // No block before it (most calls): the encoded body is the frame's body, not copied after an empty prefix.
        let body = if body.is_empty() {
            req.encode_body()
        } else {
            body.extend_from_slice(&req.encode_body());
            body
        };
        let flags = if user.is_some() { FLAG_USER } else { 0 } | if once { FLAG_ONCE } else { 0 };
        let frame = Outgoing {
            op,
            flags,
            body: &body,
            body_crc: crc32c::crc32c(&body),
            data: &data_slices,
            data_len: data_len as u32,
        };

        let mut dest = dest;
        let mut retry = Retry::new(&inner.addr, op, inner.cfg.attempts_max)
            .with_failover(inner.cfg.failover_timeout_ms)
            .with_durable_once(once);
        let began = std::time::Instant::now();
        let mut next = retry.start();
        let mut failover_logged = false;
        let mut resend = false;
        loop {
            let backoff = match next {
                Next::Send { backoff } => backoff,
                Next::RenewSession { backoff } => {
                    self.renew_session(sid).await;
                    (sid, seq) = self.next_seq(slot);
                    backoff
                }
                Next::GiveUp { error, forget_session } => {
                    if forget_session {
                        self.forget_session(sid);
                    }
                    crate::metrics::CLIENT.calls_failed.inc();
                    return Err(error);
                }
            };
            if !backoff.is_zero() {
                tokio::time::sleep(backoff).await;
            }
            if std::mem::replace(&mut resend, true) {
                crate::metrics::CLIENT.retries.inc();
                self.inner.resends.fetch_add(1, Ordering::Relaxed);
            }
            if sid == 0 && self.conn().await.is_ok() {
                // The session was forgotten (an earlier call gave up on a refused one) and `conn` has just opened
                // a new one: stamp the call with it, or the server refuses session 0. Nothing ran under 0.
                (sid, seq) = self.next_seq(slot);
            }
            let (reply, d) = self.attempt(&frame, (sid, slot, seq), dest, require_conn, retry.attempt()).await;
            dest = d;
            let (rh, rbody) = match reply {
                Ok(x) => x,
                Err(event) => {
                    next = retry.on_at(event, began.elapsed().as_millis() as u64);
                    if retry.failing_over() && !std::mem::replace(&mut failover_logged, true) {
                        warn!(addr = %inner.addr, ?op, failover_timeout_ms = inner.cfg.failover_timeout_ms,
                            "the server does not answer; waiting for it (or another of its addresses) to, as a hard mount does");
                    }
                    continue;
                }
            };
            if rh.flags & FLAG_ERROR != 0 {
                let err: WireError =
                    decode(rh.op, &rbody).map_err(|e| RpcError::Protocol { addr: inner.addr.clone(), source: e })?;
                let message = err.message.clone();
                next = retry.on_at(Event::ErrorReply(err), began.elapsed().as_millis() as u64);
                if matches!(next, Next::RenewSession { .. }) {
                    warn!(addr = %inner.addr, ?op, "server refused our session ({message}); opening a new one");
                }
                continue;
            }
            let resp = Response::decode(rh.op, &rbody)
                .map_err(|e| RpcError::Protocol { addr: inner.addr.clone(), source: e })?;
            return Ok((resp, dest));
        }
    }

    /// One attempt of a call on (session, slot, seq): sends on the live connection and waits for the reply.
    /// Gives `dest` back however it ends; a failure is reported as the retry machine's [`Event`].
    async fn attempt(
        &self,
        frame: &Outgoing<'_>,
        (sid, slot, seq): (u64, u32, u32),
        dest: Vec<BytesMut>,
        require_conn: Option<u64>,
        attempt: u32,
    ) -> (Result<(Header, Vec<u8>), Event>, Vec<BytesMut>) {
        let inner = &*self.inner;
        let timeout = Duration::from_millis(inner.cfg.call_timeout_ms);
        let conn = match self.conn().await {
            Ok(c) => c,
            Err(e) => return (Err(Event::ConnectFailed(e)), dest),
        };
        if require_conn.is_some_and(|id| id != conn.id) {
            return (Err(Event::WrongConnection), dest);
        }
        let rx = match conn.register(slot, seq, dest) {
            Ok(rx) => rx,
            Err(d) => return (Err(Event::Closed), d),
        };
        let h = Header {
            kind: FrameKind::Request,
            flags: frame.flags,
            op: frame.op as u16,
            session: sid,
            slot,
            seq,
            body_len: frame.body.len() as u32,
            data_len: frame.data_len,
            body_crc: frame.body_crc,
        };
        if inner.cfg.send_delay_us > 0 {
            send_delay(inner.cfg.send_delay_us).await;
        }
        let wrote = tokio::time::timeout(timeout, async {
            let mut w = conn.writer.lock().await;
            write_frame(&mut *w, &h, frame.body, frame.data).await
        })
        .await;
        if !matches!(wrote, Ok(Ok(()))) {
            let reason = match wrote {
                Ok(Err(e)) => format!("send failed: {e}"),
                _ => "send timed out".into(),
            };
            conn.kill();
            return (Err(Event::SendFailed(reason)), recover(rx).await);
        }
        let mut rx = rx;
        let outcome = match tokio::time::timeout(timeout, &mut rx).await {
            Ok(Ok(o)) => o,
            Ok(Err(_)) => unreachable!("the reader always answers a registered call"),
            Err(_) => {
                let op = frame.op;
                warn!(addr = %inner.addr, ?op, slot, seq, attempt, "call timed out; reconnecting to retry");
                conn.kill();
                // The killed reader fails the call promptly and gives the buffers back.
                let d = recover(rx).await;
                Err((format!("no reply within {} ms", inner.cfg.call_timeout_ms), d))
            }
        };
        match outcome {
            Ok((rh, rbody, d)) => (Ok((rh, rbody)), d),
            Err((reason, d)) => (Err(Event::NoReply(reason)), d),
        }
    }

    /// A call whose request names `bufs` by registration: registers them on the live connection (through the
    /// pin-down cache), builds the request from their chunks (`build`, one chunk per buffer, in order), and sends
    /// it on that connection only. If the connection changes before the request goes out (`RegionsLost`), the
    /// buffers are registered again on the new one and the request rebuilt, up to `REGISTER_ATTEMPTS` times.
    ///
    /// The server may read the buffers, and write them if the request asks it to, until the call returns:
    /// `bufs` is taken by value and given back with the response, so its memory stays alive and in place for
    /// that long (see [`ChunkBuffers`]). The request carries no inline payload and expects none back.
    pub async fn call_with_chunks<B: ChunkBuffers>(
        &self,
        bufs: B,
        build: impl Fn(Vec<Chunk>) -> Request,
    ) -> Result<(Response, B), RpcError> {
        let spans = bufs.spans();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let pinned = self.pin(&spans).await?;
            let req = build(pinned.chunks(&spans));
            // `bufs` stays owned here, so its memory stays put while the server reads or writes it.
            match self.call_on(req, None, Vec::new(), Vec::new(), Some(pinned.conn_id)).await {
                Ok((r, _)) => return Ok((r, bufs)),
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
        // Fast path: everything already registered and acknowledged.
        if let Some(pinned) = RegCache::hold_registered(&inner.regs, conn.id, spans) {
            return Ok(pinned);
        }
        // Misses are registered one batch at a time.
        let _serial = inner.reg_lock.lock().await;
        // A fabric that pins pages registers exactly the pages of the call, and only for the call.
        let transient = self.capabilities().pins_pages;
        let window = if transient { 4096 } else { inner.cfg.registration_window_bytes.max(4096) };
        let (pinned, batch) = RegCache::hold_or_add(&inner.regs, conn.id, spans, window, transient, |addr, len| {
            inner.fabric.register_local(self.current_addr(), addr, len)
        })
        .map_err(|source| RpcError::Connect { addr: inner.addr.clone(), source })?;
        if !batch.is_empty() {
            let sid = self.session_id();
            let added: Vec<u32> = batch.add.iter().map(|r| r.id).collect();
            let req = Request::Regions(RegionsReq { add: batch.add, remove: batch.remove });
            let r = control(&conn, &inner.addr, &inner.cfg, sid, req).await;
            let mut c = inner.regs.lock().expect("registration cache");
            match r {
                Ok(_) => c.acknowledge(&added),
                Err(e) => {
                    c.forget(&added);
                    drop(c);
                    return Err(e);
                }
            }
        }
        Ok(pinned)
    }

    fn next_seq(&self, slot: u32) -> (u64, u32) {
        let session = *self.inner.session.lock().expect("session");
        let mut s = self.inner.slots[slot as usize].lock().expect("slot");
        if s.session != session {
            s.session = session;
            s.seq = 0;
        }
        s.seq = s.seq.wrapping_add(1).max(1);
        (session, s.seq)
    }

    /// The next call number of `slot` (from 1; never reused by this client).
    fn next_call(&self, slot: u32) -> u64 {
        let mut s = self.inner.slots[slot as usize].lock().expect("slot");
        s.calls += 1;
        s.calls
    }

    fn forget_session(&self, sid: u64) {
        let mut s = self.inner.session.lock().expect("session");
        if *s == sid {
            *s = 0;
        }
    }

    /// Opens a new session if `stale` is still the current one (another call may have renewed it already).
    async fn renew_session(&self, stale: u64) {
        let _g = self.inner.control.lock().await;
        if *self.inner.session.lock().expect("session") != stale {
            return;
        }
        if let Ok(conn) = self.conn().await {
            match create_session(&conn, &self.inner.addr, &self.inner.cfg).await {
                Ok((id, _, secret)) => self.set_session(id, secret),
                Err(e) => warn!(addr = %self.inner.addr, "cannot open a new session: {e}"),
            }
        }
    }

    fn set_session(&self, id: u64, secret: Option<Secret>) {
        *self.inner.session_secret.lock().expect("session secret") = secret.map(|s| (id, s));
        *self.inner.session.lock().expect("session") = id;
    }

    /// Binds the current session to a new, authenticated connection, so calls on it are served there. A refusal
    /// (the server restarted, or forgot the session) is left for the calls to meet: the server then answers them
    /// `StaleSession` and the retry machine opens a new session, knowing what that means for exactly-once.
    async fn rebind(&self, conn: &Conn<F>) {
        let Some(&nonces) = conn.nonces.get() else { return };
        let session = *self.inner.session.lock().expect("session");
        let secret = match *self.inner.session_secret.lock().expect("session secret") {
            Some((id, secret)) if id == session && session != 0 => secret,
            _ => return,
        };
        let proof = auth::bind_proof(&secret, session, &nonces);
        let req = Request::SessionBind(SessionBindReq { session, proof });
        if let Err(e) = control(conn, &self.inner.addr, &self.inner.cfg, session, req).await {
            debug!(addr = %self.inner.addr, session = format_args!("{session:#x}"), "session not re-bound: {e}");
        }
    }

    /// The live connection, reconnecting (and re-opening a forgotten session) if needed.
    async fn conn(&self) -> std::io::Result<Arc<Conn<F>>> {
        let conn = {
            let mut g = self.inner.conn.lock().await;
            match g.as_ref() {
                Some(c) if !c.dead.load(Ordering::SeqCst) => c.clone(),
                _ => {
                    let inner = &*self.inner;
                    let start = inner.current.load(Ordering::SeqCst);
                    let (i, c) =
                        open_any(&inner.fabric, &inner.addrs, start, &inner.cfg).await.map_err(|e| match e {
                            RpcError::Connect { source, .. } => source,
                            other => std::io::Error::other(other.to_string()),
                        })?;
                    inner.current.store(i, Ordering::SeqCst);
                    if i == start {
                        debug!(addr = %inner.addrs[i], "reconnected");
                    } else {
                        warn!(from = %inner.addrs[start], to = %inner.addrs[i], "failed over to another address");
                    }
                    self.rebind(&c).await;
                    *g = Some(c.clone());
                    c
                }
            }
        };
        if *self.inner.session.lock().expect("session") == 0 {
            let _g = self.inner.control.lock().await;
            if *self.inner.session.lock().expect("session") == 0 {
                let (id, _, secret) = create_session(&conn, &self.inner.addr, &self.inner.cfg)
                    .await
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                self.set_session(id, secret);
            }
        }
        Ok(conn)
    }

    /// A session-control call outside the slots (`FabricInfo`, `FabricStat`, `Regions`): one attempt, no payload.
    pub async fn call_control(&self, req: Request) -> Result<Response, RpcError> {
        self.control_call(req).await
    }

    async fn control_call(&self, req: Request) -> Result<Response, RpcError> {
        // Connect before taking the control lock: conn() may take it to open a session.
        let conn = self.conn().await.map_err(|source| RpcError::Connect { addr: self.inner.addr.clone(), source })?;
        let _g = self.inner.control.lock().await;
        let sid = *self.inner.session.lock().expect("session");
        control(&conn, &self.inner.addr, &self.inner.cfg, sid, req).await
    }
}

/// Takes the buffers back from a call on a killed connection (its reader fails every registered call).
async fn recover(rx: oneshot::Receiver<Outcome>) -> Vec<BytesMut> {
    match rx.await {
        Ok(Ok((_, _, d))) | Ok(Err((_, d))) => d,
        Err(_) => unreachable!("the reader always answers a registered call"),
    }
}

/// The addresses of a comma-separated list, trimmed, empty ones dropped.
fn split_addrs(addr: &str) -> Vec<String> {
    addr.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect()
}

/// Connects to the first of `addrs` that answers, trying each once, from index `start` on (wrapping); returns the
/// index it connected to. Fails with the last address's error.
async fn open_any<F: Fabric>(
    fabric: &F,
    addrs: &[String],
    start: usize,
    cfg: &ClientConfig,
) -> Result<(usize, Arc<Conn<F>>), RpcError> {
    assert!(!addrs.is_empty(), "a client has at least one address");
    let mut last = None;
    for k in 0..addrs.len() {
        let i = (start + k) % addrs.len();
        match open_conn(fabric, &addrs[i], cfg).await {
            Ok(c) => return Ok((i, c)),
            Err(e) => {
                if addrs.len() > 1 {
                    debug!(addr = %addrs[i], "cannot connect: {e}");
                }
                last = Some(e);
            }
        }
    }
    Err(last.expect("one attempt per address"))
}

async fn open_conn<F: Fabric>(fabric: &F, addr: &str, cfg: &ClientConfig) -> Result<Arc<Conn<F>>, RpcError> {
    let connect = tokio::time::timeout(Duration::from_millis(cfg.connect_timeout_ms), fabric.connect(addr)).await;
    let Connection { reader, writer, killer, channel_binding, .. } = match connect {
        Ok(Ok(c)) => c,
        Ok(Err(source)) => {
            return Err(RpcError::Connect { addr: addr.to_string(), source });
        }
        Err(_) => {
            return Err(RpcError::Connect {
                addr: addr.to_string(),
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
            });
        }
    };
    let conn = Arc::new(Conn::<F> {
        id: CONN_IDS.fetch_add(1, Ordering::SeqCst),
        writer: tokio::sync::Mutex::new(writer),
        killer,
        pending: Mutex::new((false, HashMap::new())),
        dead: AtomicBool::new(false),
        nonces: std::sync::OnceLock::new(),
    });
    tokio::spawn(reader_loop(conn.clone(), reader, cfg.limits, addr.to_string()));
    if let Some(credential) = &cfg.credential {
        match authenticate(&conn, addr, cfg, credential, channel_binding.as_ref()).await {
            Ok(nonces) => {
                let _ = conn.nonces.set(nonces);
            }
            Err(e) => {
                conn.kill();
                return Err(e);
            }
        }
    }
    Ok(conn)
}

/// The client's half of the challenge–response (docs/format.md §9): checks the server's proof before giving its
/// own, so a server without our key learns nothing it could reuse.
async fn authenticate<F: Fabric>(
    conn: &Conn<F>,
    addr: &str,
    cfg: &ClientConfig,
    credential: &auth::Credential,
    channel_binding: Option<&[u8; 32]>,
) -> Result<Nonces, RpcError> {
    let refused = |reason: String| {
        warn!(addr, key_id = %credential.key_id, "authentication failed: {reason}");
        RpcError::Unauthenticated { addr: addr.to_string(), reason }
    };
    let client_nonce = auth::random_bytes().map_err(|e| refused(e.to_string()))?;
    let key_id = credential.key_id.to_string();
    let begin = Request::AuthBegin(AuthBeginReq { key_id: key_id.clone(), client_nonce });
    let resp = match control(conn, addr, cfg, 0, begin).await {
        Ok(Response::AuthBegin(r)) => r,
        Ok(other) => return Err(refused(format!("unexpected answer to AuthBegin: {other:?}"))),
        Err(RpcError::Remote(e)) => return Err(refused(format!("the server refused us: {}", e.message))),
        Err(e) => return Err(e),
    };
    // Under TLS the proofs name this TLS session (docs/format.md §11): a relay's two sessions differ.
    let nonces = Nonces { client: auth::bound_nonce(&client_nonce, channel_binding), server: resp.server_nonce };
    if !auth::server_proof_matches(&credential.key, &key_id, &nonces, &resp.server_proof) {
        return Err(refused(format!(
            "the server could not prove it holds key {key_id:?}: it has another key, or is not a server of this cluster; refusing it"
        )));
    }
    let proof = auth::client_proof(&credential.key, &key_id, &nonces.client, &nonces.server);
    match control(conn, addr, cfg, 0, Request::AuthFinish(AuthFinishReq { client_proof: proof })).await {
        Ok(_) => Ok(nonces),
        Err(RpcError::Remote(e)) => Err(refused(format!("the server refused our proof: {}", e.message))),
        Err(e) => Err(e),
    }
}

/// Whether a server's slot grant is one this client can take: at least one, at most what it asked for (a grant
/// of billions would make it allocate a slot table of that size).
fn slots_grant_ok(asked: u32, granted: u32) -> bool {
    (1..=asked.max(1)).contains(&granted)
}

async fn create_session<F: Fabric>(
    conn: &Conn<F>,
    addr: &str,
    cfg: &ClientConfig,
) -> Result<(u64, u32, Option<Secret>), RpcError> {
    let req = Request::SessionCreate(SessionCreateReq { client_name: cfg.client_name.clone(), slots: cfg.slots });
    match control(conn, addr, cfg, 0, req).await? {
        // The grant sizes the client's slot table: a server may give fewer slots than asked, never none or more.
        Response::SessionCreate(r) if slots_grant_ok(cfg.slots, r.slots) => {
            let secret = match (&cfg.credential, conn.nonces.get()) {
                (Some(c), Some(n)) => Some(auth::session_secret(&c.key, n, r.session)),
                _ => None,
            };
            Ok((r.session, r.slots, secret))
        }
        other => Err(RpcError::Protocol {
            addr: addr.to_string(),
            source: weft_proto::FrameError::BadBody {
                op: Op::SessionCreate as u16,
                reason: format!("unexpected {other:?}"),
            },
        }),
    }
}

/// A session-control call: one attempt, no slot, no payload.
async fn control<F: Fabric>(
    conn: &Conn<F>,
    addr: &str,
    cfg: &ClientConfig,
    sid: u64,
    req: Request,
) -> Result<Response, RpcError> {
    let lost = |reason: String| RpcError::ConnectionLost { addr: addr.to_string(), reason };
    let rx = conn.register(CONTROL_SLOT, 0, Vec::new()).map_err(|_| lost("connection closed".into()))?;
    let body = req.encode_body();
    let h = Header {
        kind: FrameKind::Request,
        flags: 0,
        op: req.op() as u16,
        session: sid,
        slot: CONTROL_SLOT,
        seq: 0,
        body_len: body.len() as u32,
        data_len: 0,
        body_crc: crc32c::crc32c(&body),
    };
    let timeout = Duration::from_millis(cfg.call_timeout_ms);
    let sent = {
        let mut w = conn.writer.lock().await;
        tokio::time::timeout(timeout, write_frame(&mut *w, &h, &body, &[])).await
    };
    if !matches!(sent, Ok(Ok(()))) {
        conn.kill();
        return Err(lost("send failed".into()));
    }
    let (rh, rbody, _) = match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(Ok(x))) => x,
        Ok(Ok(Err((reason, _)))) => return Err(lost(reason)),
        Ok(Err(_)) => return Err(lost("reader ended".into())),
        Err(_) => {
            conn.kill();
            return Err(RpcError::Timeout { addr: addr.to_string(), op: req.op(), attempts: 1 });
        }
    };
    if rh.flags & FLAG_ERROR != 0 {
        let err: WireError =
            decode(rh.op, &rbody).map_err(|source| RpcError::Protocol { addr: addr.to_string(), source })?;
        return Err(RpcError::Remote(err));
    }
    Response::decode(rh.op, &rbody).map_err(|source| RpcError::Protocol { addr: addr.to_string(), source })
}

async fn reader_loop<F: Fabric>(conn: Arc<Conn<F>>, reader: F::Reader, limits: FrameLimits, addr: String) {
    let mut r = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let reason: String = loop {
        let (h, body) = match read_head(&mut r, &limits).await {
            Ok(x) => x,
            Err(e) => break e.to_string(),
        };
        if h.kind != FrameKind::Reply {
            break "server sent a request frame".into();
        }
        if h.op == 0 && h.flags & FLAG_ERROR != 0 {
            // The server refused a frame it could not parse and is closing the connection.
            let msg = decode::<WireError>(0, &body).map(|e| e.message).unwrap_or_default();
            break format!("server refused our frame: {msg}");
        }
        if let Err(e) = h.check_body(&body) {
            break e.to_string();
        }
        let p = {
            let mut p = conn.pending.lock().expect("pending");
            match p.1.get(&h.slot) {
                Some(x) if x.seq == h.seq => p.1.remove(&h.slot),
                _ => None,
            }
        };
        let Some(mut p) = p else {
            // A late reply to an attempt we already gave up on.
            if let Err(e) = skip(&mut r, h.data_len as u64).await {
                break e.to_string();
            }
            continue;
        };
        let want: usize = p.dest.iter().map(|d| d.len()).sum();
        let is_error = h.flags & FLAG_ERROR != 0;
        if h.data_len as usize != want && !(is_error && h.data_len == 0) {
            let reason = format!("reply carries {} payload bytes, the call expected {want}", h.data_len);
            let _ = p.tx.send(Err((reason.clone(), p.dest)));
            break reason;
        }
        let mut failed = None;
        if h.data_len > 0 {
            for d in p.dest.iter_mut() {
                if let Err(e) = r.read_exact(&mut d[..]).await {
                    failed = Some(e.to_string());
                    break;
                }
            }
        }
        if let Some(reason) = failed {
            let _ = p.tx.send(Err((reason.clone(), p.dest)));
            break reason;
        }
        let _ = p.tx.send(Ok((h, body, p.dest)));
    };
    debug!(%addr, "client connection ended: {reason}");
    conn.killer.kill();
    conn.fail_all(&reason);
}

/// Waits `us` microseconds before a send (`ClientConfig::send_delay_us`). Below a millisecond the timer wheel is too
/// coarse, so the task yields in a loop until the time has passed: other calls keep going meanwhile, which is what
/// a window of requests in flight over a long link looks like.
async fn send_delay(us: u64) {
    let d = Duration::from_micros(us);
    if us >= 1000 {
        tokio::time::sleep(d).await;
        return;
    }
    let t = std::time::Instant::now();
    while t.elapsed() < d {
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_slot_grant_outside_what_was_asked_is_a_protocol_error() {
        assert!(super::slots_grant_ok(16, 16) && super::slots_grant_ok(16, 1));
        assert!(!super::slots_grant_ok(16, 0), "no slots");
        assert!(!super::slots_grant_ok(16, 17) && !super::slots_grant_ok(16, u32::MAX), "more than asked");
    }
}
