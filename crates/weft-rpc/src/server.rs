//! The server side: accept connections on a fabric, check every frame before acting on it, admit requests
//! through the session table, run them on the [`Service`] and send the replies.
//!
//! A frame that cannot be trusted (bad magic, version or kind, oversized lengths, truncated header) is answered with
//! an error frame and the connection is closed, since the stream can no longer be parsed. A frame whose lengths are
//! sound but whose body is bad (checksum, undecodable, data where none belongs) is answered with an error and the
//! connection goes on. Other connections are never affected.
//!
//! Connections are admitted through a table with a global and a per-peer cap (`conn.rs`); the accept loop never
//! waits on it. Every read and write has a deadline: a frame must be complete `frame_timeout_ms` after its first
//! byte, a connection with nothing arriving and no call in flight is closed after `idle_timeout_ms`, and a reply
//! not sent within `send_timeout_ms` (a peer that stops reading) closes its connection, releasing what the reply
//! held. Each connection has its own writer, so one stuck peer delays no other connection's replies.
//!
//! Admission: with authentication on (`ServerConfig::auth`), a connection is served nothing but `Null` and the
//! handshake (`AuthBegin`, `AuthFinish`; auth.rs) until it has proved a key; a session is served only on the
//! connection it is bound to (session.rs).

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::time::Instant;
use tracing::{debug, info, warn};
use weft_fabric::{Connection, Fabric, Killer, Listener, PeerCred, PeerMemory};
use weft_proto::frame::{FLAG_CACHED, FLAG_ERROR, FLAG_ONCE, FLAG_USER};
use weft_proto::msg::{AuthBeginReq, FabricInfoResp, SessionBindReq, SessionCreateResp, encode_value};
use weft_proto::{ErrorCode, FrameError, FrameKind, Header, OnceTag, Op, Request, Response, UserCred, WireError};

use crate::auth::{self, Principal, ServerAuth};
use crate::config::ServerConfig;
use crate::conn::{ConnTable, ConnTicket, RateLimitedLog};
use crate::io::{ReadError, read_head, skip, write_frame};
use crate::metrics::{FabricBytes, Metrics, OpMetrics};
use crate::pool::{BufferPool, PoolBuf};
use crate::session::{Admit, Binding, CachedReply, SessionTable};

/// Context of one call.
pub struct CallCtx {
    pub session: u64,
    pub peer: Arc<str>,
    /// Who the connection proved to be (`Anonymous` with authentication off).
    pub principal: Principal,
    /// The user the request asserts (its user block, flag `FLAG_USER`), checked for form only: what it may mean
    /// under `principal` is the service's decision.
    pub user: Option<UserCred>,
    /// The slot the request came on, and its once block (flag `FLAG_ONCE`): which call of which client it is,
    /// across sessions (a metadata service keeps the outcome of each such call, docs/format.md §27).
    pub slot: u32,
    pub once: Option<OnceTag>,
    /// The server's payload buffers, for replies that carry data.
    pub pool: BufferPool,
    /// The client's registered memory, on a one-sided fabric: where chunk lists point.
    pub memory: Option<Arc<dyn PeerMemory>>,
    /// The peer's uid, gid and pid as the kernel names them (`shm`: SO_PEERCRED at accept); None on network
    /// fabrics.
    pub peer_cred: Option<PeerCred>,
    /// The fabric the call came over (`tcp`, `shm`, `rdma`), for metrics and logs.
    pub fabric: &'static str,
}

impl CallCtx {
    /// The peer's uid when the kernel vouches for it (`shm`), for a service to check against the identity the
    /// connection's credential allows (a per-client key with a fixed uid must come from that uid or root).
    pub fn peer_uid(&self) -> Option<u32> {
        self.peer_cred.map(|c| c.uid)
    }
}

/// Bytes a reply carries after its body, sent straight from where they are (a pool buffer, a mapping of the
/// page cache, ...). Whatever the payload holds (a buffer, a lock) is released only once the bytes are sent.
pub trait ReplyData: Send + Sync + 'static {
    fn as_bytes(&self) -> &[u8];
}

impl ReplyData for PoolBuf {
    fn as_bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

/// A service's answer: the response body and, for reads, a payload sent after it.
pub struct Reply {
    pub resp: Response,
    pub data: Option<Box<dyn ReplyData>>,
}

impl From<Response> for Reply {
    fn from(resp: Response) -> Reply {
        Reply { resp, data: None }
    }
}

/// What a server does with an admitted request. `data` is the request's payload (for ops that carry one).
pub trait Service: Send + Sync + 'static {
    fn call(
        &self,
        ctx: &CallCtx,
        req: Request,
        data: Option<PoolBuf>,
    ) -> impl Future<Output = Result<Reply, WireError>> + Send;

    /// A connection closed; `sessions` made calls on it (at most [`CONN_SESSIONS_MAX`], the first ones). A session
    /// outlives its connections (a client reconnects and resends), so this is a hint, not the session's end: the MDS
    /// gives lock holders a grace period to come back (docs/format.md §14).
    fn connection_closed(&self, _sessions: &[u64]) {}
}

/// Sessions remembered per connection for [`Service::connection_closed`]: one in practice (a client binds one
/// session to a connection); a bound, so a peer cycling session ids grows nothing.
pub const CONN_SESSIONS_MAX: usize = 8;

pub struct RpcServer<F: Fabric, S: Service> {
    cfg: ServerConfig,
    service: Arc<S>,
    sessions: Arc<SessionTable>,
    pool: BufferPool,
    connections: Arc<ConnTable>,
    /// Refused, evicted and timed-out connections: logged at most once a second each, with a count of the rest.
    refusals_log: RateLimitedLog,
    deadlines_log: Arc<RateLimitedLog>,
    /// Counters, when the config names a registry.
    metrics: Option<ServerMetrics>,
    _fabric: std::marker::PhantomData<F>,
}

/// The server's series, resolved once (see `metrics.rs`).
struct ServerMetrics {
    ops: OpMetrics,
    /// Request and reply payload bytes (after the body) by fabric.
    payload: FabricBytes,
}

impl ServerMetrics {
    fn new(
        m: &Metrics,
        served: &[(usize, &'static str)],
        sessions: &Arc<SessionTable>,
        conns: &Arc<ConnTable>,
        pool: &BufferPool,
    ) -> ServerMetrics {
        let ops = OpMetrics::new(m, "weft_rpc_server_requests", "RPC requests served", served);
        let payload = FabricBytes::new(
            m,
            "weft_rpc_server_payload_bytes",
            "Payload bytes carried in RPC frames (requests in, replies out), by fabric",
        );
        let sessions_g = m.gauge("weft_rpc_sessions", "RPC sessions held");
        let slots_g = m.gauge("weft_rpc_slots_granted", "Slots granted over all sessions");
        let running_g = m.gauge("weft_rpc_slots_running", "Slots running a request now");
        let conns_g = m.gauge("weft_rpc_connections", "Connections open over all listeners");
        let free =
            prometheus_client::metrics::family::Family::<ClassLabel, prometheus_client::metrics::gauge::Gauge>::default(
            );
        let total =
            prometheus_client::metrics::family::Family::<ClassLabel, prometheus_client::metrics::gauge::Gauge>::default(
            );
        m.register("weft_rpc_pool_buffers_free", "Payload buffers not on loan, by size class (bytes)", free.clone());
        m.register("weft_rpc_pool_buffers", "Payload buffers, by size class (bytes)", total.clone());
        let arenas = m.gauge("weft_fabric_arenas", "One-sided connections holding a client's arena");
        let regions = m.gauge("weft_fabric_regions", "Client memory regions registered over all connections");
        let refused = m.gauge("weft_fabric_chunks_refused", "Chunk lists refused for leaving the registered regions");
        let (sessions, conns, pool) = (sessions.clone(), conns.clone(), pool.clone());
        m.on_scrape(move || {
            let (s, slots, running) = sessions.occupancy();
            sessions_g.set(s as i64);
            slots_g.set(slots as i64);
            running_g.set(running as i64);
            conns_g.set(conns.len() as i64);
            for c in pool.classes() {
                let l = [("class_bytes", c.buf_bytes.to_string())];
                total.get_or_create(&l).set(i64::from(c.buffers));
                free.get_or_create(&l).set(pool.available_in(c.buf_bytes) as i64);
            }
            let f = weft_fabric::memory_stats();
            arenas.set(f.arenas as i64);
            regions.set(f.regions as i64);
            refused.set(f.chunks_refused as i64);
        });
        ServerMetrics { ops, payload }
    }
}

/// Label of a pool size class: `class_bytes="65536"`.
type ClassLabel = [(&'static str, String); 1];

/// Socket read buffer for headers and bodies; payloads larger than this bypass it.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// Accept errors (EMFILE, ...) are retried after this pause, so a server out of descriptors does not spin.
const ACCEPT_RETRY_MS: u64 = 10;

struct ConnOut<F: Fabric> {
    writer: tokio::sync::Mutex<F::Writer>,
    killer: Arc<F::Killer>,
    peer: Arc<str>,
    memory: Option<Arc<dyn PeerMemory>>,
    peer_cred: Option<PeerCred>,
    /// Requests read and not yet answered: a connection is idle only when this is 0.
    calls_in_flight: AtomicUsize,
    send_timeout: Duration,
    deadlines_log: Arc<RateLimitedLog>,
    /// The connection table's id of this connection (unique for this server's life): sessions are bound to it.
    id: u64,
    /// Set once the connection is authenticated (at once with authentication off).
    principal: OnceLock<Principal>,
    /// The handshake so far; only the read loop touches it.
    auth: Mutex<ServerAuth>,
    /// The fabric's channel binding (TLS), mixed into the handshake's client nonce.
    channel_binding: Option<[u8; 32]>,
    /// The listener's fabric, an index into `metrics::FABRICS`.
    fabric: usize,
    /// The last session that called here (a cheap check before `sessions`) and the sessions seen, for
    /// [`Service::connection_closed`].
    last_session: AtomicU64,
    sessions: Mutex<Vec<u64>>,
}

impl<F: Fabric, S: Service> RpcServer<F, S> {
    pub fn new(cfg: ServerConfig, service: Arc<S>) -> Arc<Self> {
        // A server that takes no payloads (the MDS) still gets a token pool, so the type stays uniform.
        let pool = BufferPool::new((cfg.limits.data_bytes_max as usize).max(1), cfg.pool_buffers.max(1));
        Self::with_pool(cfg, service, pool)
    }

    /// A server lending payload buffers from `pool`, whose largest class must hold `limits.data_bytes_max`.
    pub fn with_pool(mut cfg: ServerConfig, service: Arc<S>, pool: BufferPool) -> Arc<Self> {
        // A payload is read into one buffer: never accept one larger than the largest class.
        cfg.limits.data_bytes_max = cfg.limits.data_bytes_max.min(u32::try_from(pool.buf_bytes()).unwrap_or(u32::MAX));
        let sessions = Arc::new(
            SessionTable::new(cfg.slots_max, cfg.sessions_max, cfg.session_idle_ms)
                .with_per_key_max(cfg.sessions_per_key_max),
        );
        let connections = ConnTable::new(cfg.connections_max, cfg.connections_per_peer_max);
        let metrics =
            cfg.metrics.as_ref().map(|m| ServerMetrics::new(m, &cfg.served_ops, &sessions, &connections, &pool));
        Arc::new(RpcServer {
            sessions,
            connections,
            metrics,
            cfg,
            service,
            pool,
            refusals_log: RateLimitedLog::new(Duration::from_secs(1)),
            deadlines_log: Arc::new(RateLimitedLog::new(Duration::from_secs(1))),
            _fabric: std::marker::PhantomData,
        })
    }

    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// Accepts and serves connections until the listener fails. Never waits on a limit: a connection over one is
    /// closed at once (or makes room by evicting one not yet proven), see `conn.rs`.
    pub async fn serve(self: Arc<Self>, mut listener: F::Listener) -> std::io::Result<()> {
        let fabric = crate::metrics::fabric_index(&listener.local_addr().unwrap_or_default());
        loop {
            let conn = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Transient accept errors (EMFILE, ECONNABORTED) must not end the server. Out of descriptors,
                    // closing a connection not yet proven lets the next accept succeed.
                    let evicted = is_out_of_descriptors(&e) && self.connections.evict_oldest_unproven();
                    if let Some(held_back) = self.refusals_log.allow() {
                        warn!(evicted, held_back, "accept failed: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
                    continue;
                }
            };
            let killer = Arc::new(conn.killer);
            let admitted = match self.connections.admit(&conn.peer, killer.clone()) {
                Ok(a) => a,
                Err(refusal) => {
                    killer.kill();
                    if let Some(held_back) = self.refusals_log.allow() {
                        warn!(peer = %conn.peer, held_back, "refusing a connection: {refusal}");
                    }
                    continue;
                }
            };
            if admitted.evicted.is_some()
                && let Some(held_back) = self.refusals_log.allow()
            {
                warn!(
                    peer = %conn.peer,
                    held_back,
                    "connection table full: closed the oldest connection not yet proven (no key proved, or nothing asked but Null)"
                );
            }
            let Connection { reader, writer, killer: _, peer, memory, peer_cred, channel_binding } = conn;
            let out = Arc::new(ConnOut::<F> {
                writer: tokio::sync::Mutex::new(writer),
                killer,
                peer: peer.into(),
                memory,
                peer_cred,
                calls_in_flight: AtomicUsize::new(0),
                send_timeout: Duration::from_millis(self.cfg.send_timeout_ms),
                deadlines_log: self.deadlines_log.clone(),
                id: admitted.ticket.id(),
                principal: OnceLock::new(),
                auth: Mutex::new(ServerAuth::Fresh),
                channel_binding,
                fabric,
                last_session: AtomicU64::new(0),
                sessions: Mutex::new(Vec::new()),
            });
            if self.cfg.auth.is_none() {
                let _ = out.principal.set(Principal::Anonymous);
            }
            let me = self.clone();
            tokio::spawn(async move { me.serve_conn(out, reader, admitted.ticket).await });
        }
    }

    /// Reads frames until the peer closes the connection, breaks the protocol or misses a deadline, and hands
    /// each request to `dispatch`.
    async fn serve_conn(self: Arc<Self>, out: Arc<ConnOut<F>>, reader: F::Reader, ticket: ConnTicket) {
        let peer = out.peer.clone();
        debug!(%peer, one_sided = out.memory.is_some(), "connection open");
        let mut r = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
        let limits = self.cfg.limits;
        let frame_timeout = Duration::from_millis(self.cfg.frame_timeout_ms);
        let idle_timeout = Duration::from_millis(self.cfg.idle_timeout_ms);
        // The first frame's deadline runs from the accept: a connection that never sends is not merely idle.
        let mut first_frame_deadline = Some(Instant::now() + frame_timeout);
        let mut proven = false;
        loop {
            let deadline = match first_frame_deadline {
                Some(d) => d,
                None => match next_frame_begins(&mut r, idle_timeout, &out.calls_in_flight).await {
                    Ok(FrameStart::Begun) => Instant::now() + frame_timeout,
                    Ok(FrameStart::Closed) => break,
                    Ok(FrameStart::Idle) => {
                        info!(%peer, idle_ms = self.cfg.idle_timeout_ms, "closing an idle connection");
                        break;
                    }
                    Err(e) => {
                        debug!(%peer, "connection ended: {e}");
                        break;
                    }
                },
            };
            let (h, body) = match tokio::time::timeout_at(deadline, read_head(&mut r, &limits)).await {
                Err(_) => {
                    self.frame_deadline_missed(&peer);
                    break;
                }
                Ok(Ok(x)) => x,
                Ok(Err(ReadError::Closed)) => break,
                Ok(Err(ReadError::Io(e))) => {
                    debug!(%peer, "connection ended: {e}");
                    break;
                }
                Ok(Err(e @ ReadError::PeerSpeaksTls)) => {
                    warn!(%peer, "refusing a connection: {e}");
                    break;
                }
                Ok(Err(ReadError::Frame(e))) => {
                    warn!(%peer, "refusing malformed frame, closing connection: {e}");
                    let err = WireError::new(ErrorCode::BadRequest, e.to_string());
                    let h0 = Header {
                        kind: FrameKind::Reply,
                        flags: 0,
                        op: 0,
                        session: 0,
                        slot: 0,
                        seq: 0,
                        body_len: 0,
                        data_len: 0,
                        body_crc: 0,
                    };
                    send_reply(&out, &h0, FLAG_ERROR, Bytes::from(encode_value(&err)), None).await;
                    break;
                }
            };
            if h.kind != FrameKind::Request {
                warn!(%peer, "peer sent a reply frame to a server, closing connection");
                let err = WireError::new(ErrorCode::BadRequest, "expected a request frame");
                send_reply(&out, &h, FLAG_ERROR, Bytes::from(encode_value(&err)), None).await;
                break;
            }
            // From here every request gets exactly one reply through `send_reply` (which counts it answered), or
            // its connection is closed.
            out.calls_in_flight.fetch_add(1, Ordering::Relaxed);
            let refuse = |e: FrameError| WireError::new(ErrorCode::BadRequest, e.to_string());
            let decoded = h
                .check_body(&body)
                .and_then(|()| split_blocks(&h, &body))
                .and_then(|(user, once, rest)| Ok((user, once, Request::decode(h.op, rest)?)))
                .map_err(refuse)
                .and_then(|(user, once, req)| {
                    if h.data_len > 0 && !req.op().request_has_data() {
                        Err(refuse(FrameError::UnexpectedData { op: h.op, len: h.data_len }))
                    } else {
                        Ok((user, once, req))
                    }
                });
            let (user, once, req) = match decoded {
                Ok(x) => x,
                Err(err) => {
                    warn!(%peer, op = h.op, "refusing request: {}", err.message);
                    match tokio::time::timeout_at(deadline, skip(&mut r, h.data_len as u64)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => break,
                        Err(_) => {
                            self.frame_deadline_missed(&peer);
                            break;
                        }
                    }
                    first_frame_deadline = None;
                    send_reply(&out, &h, FLAG_ERROR, Bytes::from(encode_value(&err)), None).await;
                    continue;
                }
            };
            let data = if h.data_len > 0 {
                // Waiting here for a pool buffer is the back-pressure: the socket is not read meanwhile. That wait
                // is the server's, not the peer's, so it extends the frame's deadline.
                let wait_began = Instant::now();
                let mut buf = self.pool.acquire(h.data_len as usize).await;
                let deadline = deadline + wait_began.elapsed();
                match tokio::time::timeout_at(deadline, r.read_exact(buf.as_mut_slice())).await {
                    Ok(Ok(_)) => Some(buf),
                    Ok(Err(e)) => {
                        debug!(%peer, "connection ended inside a payload: {e}");
                        break;
                    }
                    Err(_) => {
                        self.frame_deadline_missed(&peer);
                        break;
                    }
                }
            } else {
                None
            };
            first_frame_deadline = None;
            let op = h.op;
            self.dispatch(&out, h, Call { req, user, once, data }).await;
            // Proven (never evicted for a newcomer: conn.rs) only once the peer proved a key (with authentication
            // off, at once) and asked for real work: a `Null`, a refused frame or a handshake half done prove
            // nothing, or anyone could pin the table with connections that only ever ping.
            if !proven && op != Op::Null as u16 && out.principal.get().is_some() {
                ticket.mark_proven();
                proven = true;
            }
        }
        if let Some(key_id) = out.auth.lock().expect("handshake").pending_key_id() {
            warn!(%peer, key_id, "peer left during authentication without proving the key: it holds another key (see its log)");
        }
        // Leave the table before the (possibly slow) revoke, so a new connection can take the place.
        drop(ticket);
        // Calls still running must not write into memory the client may reuse once it saw the connection die.
        if let Some(m) = &out.memory {
            m.revoke();
        }
        let sessions = std::mem::take(&mut *out.sessions.lock().expect("connection sessions"));
        if !sessions.is_empty() {
            self.service.connection_closed(&sessions);
        }
        debug!(%peer, "connection closed");
    }

    /// A peer did not complete a frame in time: log (rate-limited, a flood of half-open connections would flood
    /// the log) and let the caller close the connection.
    fn frame_deadline_missed(&self, peer: &str) {
        if let Some(held_back) = self.deadlines_log.allow() {
            info!(%peer, frame_timeout_ms = self.cfg.frame_timeout_ms, held_back, "frame not completed in time, closing connection");
        }
    }

    async fn dispatch(self: &Arc<Self>, out: &Arc<ConnOut<F>>, h: Header, call: Call) {
        let began = std::time::Instant::now();
        let req = &call.req;
        let open = matches!(req, Request::Null(()) | Request::AuthBegin(_) | Request::AuthFinish(_));
        if !open && out.principal.get().is_none() {
            warn!(peer = %out.peer, op = ?req.op(), "refusing a request on a connection that has not authenticated (does the peer have our key_file?)");
            let err = WireError::new(
                ErrorCode::Unauthenticated,
                "this server requires authentication (AuthBegin/AuthFinish with a key) before any other request",
            );
            send_reply(out, &h, FLAG_ERROR, Bytes::from(encode_value(&err)), None).await;
            return;
        }
        let result = match req {
            Request::Null(()) => Ok(Response::Null(())),
            Request::AuthBegin(_) | Request::AuthFinish(_) | Request::SessionBind(_) => {
                self.authenticate(out, req).inspect(|_| {
                    if let Some(p) = out.principal.get().filter(|_| matches!(req, Request::AuthFinish(_))) {
                        debug!(peer = %out.peer, principal = p.name(), "connection authenticated");
                    }
                })
            }
            Request::SessionCreate(c) => {
                let binding = |id| self.binding(out, id);
                self.sessions.create(&c.client_name, c.slots, binding).map(|(session, slots)| {
                    let key = out.principal.get().map_or("-", |p| p.name());
                    info!(peer = %out.peer, client = %c.client_name, key, session = format_args!("{session:#x}"), slots, "session created");
                    Response::SessionCreate(SessionCreateResp { session, slots })
                })
            }
            Request::SessionDestroy(()) => {
                self.sessions.destroy(h.session, out.id).map(Response::SessionDestroy).inspect_err(|e| {
                    warn!(peer = %out.peer, "refusing to destroy a session: {}", e.message);
                })
            }
            // Registration belongs to the connection (its memory), so it is answered here, outside the slots.
            Request::Regions(r) => match &out.memory {
                Some(m) => m.register(&r.add, &r.remove).map(|()| Response::Regions(())).map_err(|e| {
                    warn!(peer = %out.peer, "refusing a registration: {e}");
                    WireError::new(ErrorCode::BadRequest, e.to_string())
                }),
                None => Err(WireError::new(ErrorCode::BadRequest, "this connection's fabric has no one-sided memory")),
            },
            Request::FabricInfo(()) => Ok(Response::FabricInfo(FabricInfoResp {
                host_id: weft_fabric::host_id(),
                shm_addr: self.cfg.shm_addr.clone(),
                rdma_addr: self.cfg.rdma_addr.clone(),
            })),
            Request::FabricStat(()) => Ok(Response::FabricStat(weft_fabric::memory_stats())),
            _ => {
                let me = self.clone();
                let out = out.clone();
                match self.sessions.admit(h.session, out.id, h.slot, h.seq) {
                    Admit::Execute => {
                        tokio::spawn(async move { me.execute(&out, h, call, true).await });
                    }
                    Admit::Reexecute => {
                        tokio::spawn(async move { me.execute(&out, h, call, false).await });
                    }
                    Admit::Replay(c) => {
                        info!(peer = %out.peer, slot = h.slot, seq = h.seq, "retransmission answered from the reply cache");
                        send_reply(&out, &h, c.flags | FLAG_CACHED, c.body, None).await;
                    }
                    Admit::Wait(rx) => {
                        tokio::spawn(async move { me.await_original(&out, h, call, rx).await });
                    }
                    Admit::Reject(err) => {
                        warn!(peer = %out.peer, op = h.op, "refusing request: {}", err.message);
                        send_reply(&out, &h, FLAG_ERROR, Bytes::from(encode_value(&err)), None).await;
                    }
                }
                return;
            }
        };
        if let Some(m) = &self.metrics {
            m.ops.record(h.op as usize, result.is_ok(), began.elapsed());
        }
        let (flags, body) = match result {
            Ok(resp) => (0, resp.encode_body()),
            Err(err) => (FLAG_ERROR, encode_value(&err)),
        };
        send_reply(out, &h, flags, Bytes::from(body), None).await;
    }

    /// The handshake ops and `SessionBind`, answered on the read loop (they belong to the connection).
    fn authenticate(&self, out: &ConnOut<F>, req: &Request) -> Result<Response, WireError> {
        let Some(ring) = &self.cfg.auth else {
            return match req {
                // Authentication off: sessions are not bound, so there is nothing to re-bind.
                Request::SessionBind(_) => Ok(Response::SessionBind(())),
                _ => {
                    warn!(peer = %out.peer, "peer wants to authenticate, but authentication is off here (auth = \"none\")");
                    Err(WireError::new(
                        ErrorCode::Unauthenticated,
                        "authentication is off on this server (auth = \"none\")",
                    ))
                }
            };
        };
        let mut state = out.auth.lock().expect("handshake");
        let result = match req {
            Request::AuthBegin(b) => {
                // Under TLS the proofs name this TLS session (docs/format.md §11): a relay's two sessions differ.
                let client_nonce = auth::bound_nonce(&b.client_nonce, out.channel_binding.as_ref());
                state.begin(ring, &AuthBeginReq { client_nonce, ..b.clone() }).map(Response::AuthBegin)
            }
            Request::AuthFinish(f) => state.finish(f).and_then(|a| {
                peer_may_hold(&a.principal, out.peer_cred)?;
                let _ = out.principal.set(a.principal.clone());
                Ok(Response::AuthFinish(()))
            }),
            Request::SessionBind(SessionBindReq { session, proof }) => match &*state {
                ServerAuth::Done(a) => {
                    let key_id = a.principal.name();
                    let nonces = a.nonces;
                    self.sessions
                        .bind(*session, out.id, key_id, |secret| auth::bind_proof_matches(secret, *session, &nonces, proof))
                        .map(|()| {
                            debug!(peer = %out.peer, session = format_args!("{session:#x}"), "session bound to a new connection");
                            Response::SessionBind(())
                        })
                }
                _ => Err(WireError::new(ErrorCode::Unauthenticated, "SessionBind before authenticating")),
            },
            _ => unreachable!("only handshake ops come here"),
        };
        if let Err(e) = &result {
            // The key the peer claims: named by AuthBegin, else the one the handshake is about.
            let key = match req {
                Request::AuthBegin(b) => b.key_id.clone(),
                _ => state.pending_key_id().map(str::to_string).unwrap_or_default(),
            };
            warn!(peer = %out.peer, key, op = req.op().name(), "authentication refused: {}", e.message);
        }
        result
    }

    /// The binding of a session created on `out` (none with authentication off).
    fn binding(&self, out: &ConnOut<F>, session: u64) -> Result<Option<Binding>, WireError> {
        let r = session_binding(self.cfg.auth.is_some(), &out.auth.lock().expect("handshake"), out.id, session);
        if let Err(e) = &r {
            warn!(peer = %out.peer, "refusing SessionCreate: {}", e.message);
        }
        r
    }

    /// A retransmission arrived while the original ran: wait for it, then answer as the slot now says.
    async fn await_original(
        self: Arc<Self>,
        out: &Arc<ConnOut<F>>,
        h: Header,
        call: Call,
        mut rx: tokio::sync::watch::Receiver<bool>,
    ) {
        let _ = rx.wait_for(|done| *done).await;
        match self.sessions.admit(h.session, out.id, h.slot, h.seq) {
            Admit::Replay(c) => send_reply(out, &h, c.flags | FLAG_CACHED, c.body, None).await,
            Admit::Reexecute => self.execute(out, h, call, false).await,
            Admit::Reject(err) => send_reply(out, &h, FLAG_ERROR, Bytes::from(encode_value(&err)), None).await,
            // The session was replaced meanwhile or the slot moved on: nothing sensible to answer.
            Admit::Execute | Admit::Wait(_) => out.killer.kill(),
        }
    }

    async fn execute(&self, out: &Arc<ConnOut<F>>, h: Header, call: Call, track: bool) {
        let Call { req, user, once, data } = call;
        let op = req.op();
        let began = std::time::Instant::now();
        if out.last_session.swap(h.session, Ordering::Relaxed) != h.session {
            let mut seen = out.sessions.lock().expect("connection sessions");
            if !seen.contains(&h.session) && seen.len() < CONN_SESSIONS_MAX {
                seen.push(h.session);
            }
        }
        let ctx = CallCtx {
            session: h.session,
            peer: out.peer.clone(),
            principal: out.principal.get().cloned().unwrap_or(Principal::Anonymous),
            user,
            slot: h.slot,
            once,
            pool: self.pool.clone(),
            memory: out.memory.clone(),
            peer_cred: out.peer_cred,
            fabric: crate::metrics::FABRICS[out.fabric],
        };
        let (flags, body, payload) = match self.service.call(&ctx, req, data).await {
            Ok(reply) => (0, Bytes::from(reply.resp.encode_body()), reply.data),
            Err(err) => {
                let session = format_args!("{:#x}", h.session);
                debug!(peer = %out.peer, key = ctx.principal.name(), session = %session, op = op.name(), code = ?err.code, "error returned to the client: {}", err.message);
                (FLAG_ERROR, Bytes::from(encode_value(&err)), None)
            }
        };
        if let Some(m) = &self.metrics {
            m.ops.record(h.op as usize, flags & FLAG_ERROR == 0, began.elapsed());
            m.payload.add(out.fabric, true, u64::from(h.data_len));
            m.payload.add(out.fabric, false, payload.as_ref().map_or(0, |p| p.as_bytes().len() as u64));
        }
        if track {
            let cached = (!op.is_idempotent()).then(|| CachedReply { flags, body: body.clone() });
            self.sessions.complete(h.session, h.slot, h.seq, cached);
        }
        if crate::fault::exit_after_execute(h.op) {
            warn!(peer = %out.peer, ?op, "fault injection: exiting after execute, before the reply");
            std::process::exit(137);
        }
        if crate::fault::drop_after_execute(h.op) {
            warn!(peer = %out.peer, ?op, "fault injection: dropping the connection instead of replying");
            out.killer.kill();
            return;
        }
        send_reply(out, &h, flags, body, payload).await;
    }
}

async fn send_reply<F: Fabric>(
    out: &ConnOut<F>,
    req: &Header,
    flags: u8,
    body: Bytes,
    data: Option<Box<dyn ReplyData>>,
) {
    let data_slice: &[u8] = data.as_ref().map(|d| d.as_bytes()).unwrap_or(&[]);
    let h = Header {
        kind: FrameKind::Reply,
        flags,
        op: req.op,
        session: req.session,
        slot: req.slot,
        seq: req.seq,
        body_len: body.len() as u32,
        data_len: data_slice.len() as u32,
        body_crc: crc32c::crc32c(&body),
    };
    // The deadline covers the wait for the writer too: behind a stuck send, every later reply expires as well.
    let send = async {
        let mut w = out.writer.lock().await;
        write_frame(&mut *w, &h, &body, &[data_slice]).await
    };
    match tokio::time::timeout(out.send_timeout, send).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            debug!(peer = %out.peer, "reply not delivered: {e}");
            out.killer.kill();
        }
        Err(_) => {
            if let Some(held_back) = out.deadlines_log.allow() {
                warn!(peer = %out.peer, send_timeout_ms = out.send_timeout.as_millis() as u64, held_back, "reply not sent in time (the peer does not read), closing connection");
            }
            out.killer.kill();
        }
    }
    // Only now is the reply's payload (a pool buffer, a mapping and its range lock) released, by the caller's drop.
    if req.kind == FrameKind::Request {
        out.calls_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where the kernel names the peer (shm: SO_PEERCRED), a key bound to one user (`weft key add --uid U`) is
/// accepted only from a process of that user or root: another local user who stole the key file still cannot
/// use it over shm.
fn peer_may_hold(principal: &Principal, peer: Option<PeerCred>) -> Result<(), WireError> {
    match (principal, peer) {
        (Principal::Key { key_id, policy: crate::KeyPolicy::Fixed { uid, .. } }, Some(p))
            if p.uid != 0 && p.uid != *uid =>
        {
            Err(WireError::new(
                ErrorCode::Unauthenticated,
                format!("key {key_id:?} belongs to uid {uid}, but the connecting process runs as uid {}", p.uid),
            ))
        }
        _ => Ok(()),
    }
}

/// The binding of session `session` created on connection `conn` whose handshake is `state`: none with
/// authentication off. Fails closed: admission only lets `SessionCreate` through on an authenticated connection,
/// but should that ever not hold, the session is refused rather than created unbound (usable from anywhere).
fn session_binding(auth_on: bool, state: &ServerAuth, conn: u64, session: u64) -> Result<Option<Binding>, WireError> {
    if !auth_on {
        return Ok(None);
    }
    match state {
        ServerAuth::Done(a) => Ok(Some(Binding {
            conn,
            key_id: a.principal.name().into(),
            secret: auth::session_secret(&a.key, &a.nonces, session),
        })),
        _ => Err(WireError::new(
            ErrorCode::Unauthenticated,
            "SessionCreate on a connection that has not completed authentication",
        )),
    }
}

/// A decoded request on its way to the service.
struct Call {
    req: Request,
    user: Option<UserCred>,
    once: Option<OnceTag>,
    data: Option<PoolBuf>,
}

/// A request body's blocks as `Call` holds them: its user block, its once block, and the op's body.
type Blocks<'b> = (Option<UserCred>, Option<OnceTag>, &'b [u8]);

/// Splits a request body into its user block (with `FLAG_USER`), its once block (with `FLAG_ONCE`), in that order,
/// and the op's body.
fn split_blocks<'b>(h: &Header, body: &'b [u8]) -> Result<Blocks<'b>, FrameError> {
    let (user, rest) = match h.flags & FLAG_USER {
        0 => (None, body),
        _ => UserCred::decode_prefix(body).map(|(u, rest)| (Some(u), rest))?,
    };
    let (once, rest) = match h.flags & FLAG_ONCE {
        0 => (None, rest),
        _ => OnceTag::decode_prefix(rest).map(|(o, rest)| (Some(o), rest))?,
    };
    Ok((user, once, rest))
}

/// How the wait between frames ended.
enum FrameStart {
    /// A byte of the next frame is buffered.
    Begun,
    /// The peer closed the connection between frames.
    Closed,
    /// Nothing arrived for the idle timeout and no call is in flight.
    Idle,
}

/// Waits for the first byte of the next frame. A connection with calls in flight is never idle: its peer waits
/// for replies.
async fn next_frame_begins<R: AsyncBufRead + Unpin>(
    r: &mut R,
    idle_timeout: Duration,
    calls_in_flight: &AtomicUsize,
) -> std::io::Result<FrameStart> {
    loop {
        // Cancelling `fill_buf` loses nothing: what it read stays in the buffer.
        match tokio::time::timeout(idle_timeout, r.fill_buf()).await {
            Ok(Ok(buf)) => return Ok(if buf.is_empty() { FrameStart::Closed } else { FrameStart::Begun }),
            Ok(Err(e)) => return Err(e),
            Err(_) if calls_in_flight.load(Ordering::Relaxed) == 0 => return Ok(FrameStart::Idle),
            Err(_) => continue,
        }
    }
}

/// EMFILE or ENFILE (Linux): the process or the system is out of file descriptors.
fn is_out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(23 | 24))
}

/// Op code of a request, for logs of refused frames.
pub fn op_name(op: u16) -> String {
    Op::from_u16(op).map(|o| format!("{o:?}")).unwrap_or_else(|| format!("op {op}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Authenticated, Key, Nonces};

    #[test]
    fn session_binding_fails_closed_on_an_unauthenticated_connection() {
        assert!(session_binding(false, &ServerAuth::Fresh, 1, 7).unwrap().is_none(), "auth off: no binding");
        let e = session_binding(true, &ServerAuth::Fresh, 1, 7).err().expect("refused");
        assert_eq!(e.code, ErrorCode::Unauthenticated);
        let a = Authenticated {
            principal: Principal::Key { key_id: "cluster".into(), policy: crate::KeyPolicy::Cluster },
            key: Key::from_bytes([3; 32]),
            nonces: Nonces { client: [1; 32], server: [2; 32] },
        };
        let b = session_binding(true, &ServerAuth::Done(a), 9, 7).unwrap().expect("bound");
        assert_eq!((b.conn, &*b.key_id), (9, "cluster"));
    }

    #[test]
    fn a_key_bound_to_one_user_is_refused_from_another_users_process_over_shm() {
        let alice = Principal::Key { key_id: "alice".into(), policy: crate::KeyPolicy::Fixed { uid: 1000, gid: 100 } };
        let cred = |uid| Some(PeerCred { uid, gid: uid, pid: 42 });
        assert!(peer_may_hold(&alice, cred(1000)).is_ok(), "its own user");
        assert!(peer_may_hold(&alice, cred(0)).is_ok(), "root (a FUSE daemon) may hold any key");
        assert_eq!(peer_may_hold(&alice, cred(1001)).unwrap_err().code, ErrorCode::Unauthenticated);
        assert!(peer_may_hold(&alice, None).is_ok(), "tcp/rdma: the kernel names no peer");
        let cluster = Principal::Key { key_id: "cluster".into(), policy: crate::KeyPolicy::Cluster };
        assert!(peer_may_hold(&cluster, cred(1001)).is_ok(), "the cluster key is a host's: no user to match");
    }
}
