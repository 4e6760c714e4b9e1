//! Tunables of the RPC layer, with the defaults used when a config file does not name them.

use std::sync::Arc;

use weft_proto::FrameLimits;

use crate::auth::{Credential, KeyRing};
use crate::metrics::Metrics;

#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Name reported to servers, for their logs.
    pub client_name: String,
    /// Slots asked for per session: the most requests in flight to one server.
    pub slots: u32,
    pub connect_timeout_ms: u64,
    /// Deadline of one attempt, from send to reply.
    pub call_timeout_ms: u64,
    /// Attempts per call before giving up (the first try counts).
    pub attempts_max: u32,
    /// With more than 0: a call whose server cannot be reached (refused, closed, unanswered) keeps retrying,
    /// over every address the client was given, until this long after it began, even past `attempts_max`: the
    /// application blocks and resumes as on a hard NFS mount. For the metadata service (`mds_failover_timeout_ms`);
    /// data servers keep 0, since a read or write there has other servers to turn to.
    pub failover_timeout_ms: u64,
    /// Send a once block (`FLAG_ONCE`, docs/format.md §1) with every call of an op that is not idempotent, and
    /// trust the server to keep each such call's outcome beyond its sessions (a metadata service does, §27): a retry
    /// on a new session is then answered with the first attempt's outcome, never reported "maybe applied".
    pub once_tags: bool,
    /// Limits on replies this client accepts.
    pub limits: FrameLimits,
    /// Benchmarks only (`weft bench --delay-us`): each request waits this long before it is sent, emulating a
    /// one-way WAN delay (netem is not available). 0 = none.
    pub send_delay_us: u64,
    /// Registrations kept per server connection in the pin-down cache (LRU; evicted ones are deregistered in the
    /// next batch).
    pub registrations_max: usize,
    /// Registrations cover aligned windows of this size, so neighbouring buffers share one (on a fabric that pins
    /// pages, a registration covers exactly the pages of one call instead).
    pub registration_window_bytes: u64,
    /// The key this client proves on every connection (docs/format.md §9); `None`: it proves none, and only
    /// servers with authentication off serve it.
    pub credential: Option<Credential>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            client_name: format!("weft-client-{}", std::process::id()),
            slots: 16,
            connect_timeout_ms: 5_000,
            call_timeout_ms: 30_000,
            attempts_max: 5,
            failover_timeout_ms: 0,
            once_tags: false,
            limits: FrameLimits { body_bytes_max: 8 << 20, data_bytes_max: 4 << 20 },
            send_delay_us: 0,
            registrations_max: 256,
            registration_window_bytes: 2 << 20,
            credential: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Limits on requests this server accepts; `data_bytes_max` is also the pool's buffer size.
    pub limits: FrameLimits,
    /// Most slots granted per session.
    pub slots_max: u32,
    /// Most sessions held at once; idle ones are evicted to make room, otherwise new sessions are refused.
    pub sessions_max: u32,
    /// Most sessions one per-client key holds at once (the cluster key, held by the cluster's servers and trusted
    /// hosts, is not counted): one client cannot fill the table for everyone.
    pub sessions_per_key_max: u32,
    /// A session unused this long may be evicted.
    pub session_idle_ms: u64,
    /// Buffers in the server's pool made by [`crate::RpcServer::new`] (each `limits.data_bytes_max` bytes, one zone
    /// allocated and pre-faulted at start); a server with size classes passes its own pool to `with_pool`.
    pub pool_buffers: u32,
    /// The server's `shm` listener (`unix:/path`), announced to clients in `FabricInfo`.
    pub shm_addr: Option<String>,
    /// The server's `rdma` listener (`rdma:host:port`), announced to clients in `FabricInfo`.
    pub rdma_addr: Option<String>,
    /// Deadline for a whole request frame (header, body and payload) once its first byte has arrived; a new
    /// connection must complete its first frame this long after it was accepted. On expiry the connection is
    /// closed. Time spent waiting for a pool buffer (the server's own back-pressure) does not count.
    pub frame_timeout_ms: u64,
    /// A connection with no frame arriving and no call in flight for this long is closed.
    pub idle_timeout_ms: u64,
    /// Deadline for sending one reply (including the wait for the connection's writer): a peer that does not read
    /// its replies has its connection closed and the reply's buffers (and locks) released.
    pub send_timeout_ms: u64,
    /// Most connections open at once over all listeners. At the cap the oldest connection that has not completed
    /// a frame is closed to admit a new one; when there is none the new one is refused.
    pub connections_max: usize,
    /// Most connections from one peer IP address (tcp, and rdma's side channel; `shm` peers are not limited per
    /// peer). Further ones are closed at once.
    pub connections_per_peer_max: u32,
    /// The keys clients must prove before anything but `Null` is served; `None`: authentication is off (every
    /// connection is trusted, sessions are not bound to connections).
    pub auth: Option<Arc<KeyRing>>,
    /// Where the server's counters go (requests, errors and latency by op, bytes by fabric, sessions, slots,
    /// connections, pool buffers); `None`: not counted.
    pub metrics: Option<Arc<Metrics>>,
    /// The ops this server answers, as (code, name): the label sets of its per-op series, which each role names
    /// for itself. Others are answered but not counted.
    pub served_ops: Vec<(usize, &'static str)>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            limits: FrameLimits { body_bytes_max: 1 << 20, data_bytes_max: 2 << 20 },
            slots_max: 64,
            sessions_max: 1024,
            sessions_per_key_max: 256,
            session_idle_ms: 300_000,
            pool_buffers: 32,
            shm_addr: None,
            rdma_addr: None,
            // 4 MiB (the largest payload) at 2 Mbit/s takes 17 s: a generous bound even for slow links, still
            // short enough that a half-open connection is gone well before a client's call timeout (30 s).
            frame_timeout_ms: 20_000,
            // As the session table's idle time: a client with nothing to do reconnects on its next call.
            idle_timeout_ms: 300_000,
            // As a client's call timeout: past it the client has given up on the reply anyway.
            send_timeout_ms: 30_000,
            connections_max: 4096,
            // A quarter of the cap: a node running hundreds of client processes fits, and no single host can take
            // the whole table.
            connections_per_peer_max: 1024,
            auth: None,
            metrics: None,
            served_ops: Vec::new(),
        }
    }
}
