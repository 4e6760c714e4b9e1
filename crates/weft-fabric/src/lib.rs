//! Endpoints: how two Weft processes reach each other.
//!
//! A [`Fabric`] opens connections and listens; each connection is a reader, a writer and a [`Killer`] that can
//! tear the connection down from any task (so a timed-out caller never waits on a blocked reader). The RPC layer
//! (`weft-rpc`) is generic over the fabric and never names TCP. Backends advertise [`Capabilities`] so the RPC layer
//! can pick the data path:
//!
//! - two-sided messages: every backend; the frames of `weft-rpc` travel as a byte stream (`tcp`: bulk data rides
//!   in the stream after the header);
//! - one-sided `get`/`put`: the server side of a connection may hold a [`PeerMemory`], the client memory that
//!   the client registered (its arena, passed at connect, plus regions registered later with the `Regions` op).
//!   The server moves bulk data between its own buffers and that memory; it never exposes its own memory. Every
//!   chunk is checked against the registered regions ([`weft_proto::RegionTable::check`]) before a byte moves.
//!   An rdma backend implements the same trait with RDMA READ/WRITE on registered memory regions (remote keys
//!   travel in [`weft_proto::Region`]) and waits for the completions.
//!
//! Backends: [`tcp`] (always; under TLS 1.3 when given a [`TlsConfig`], see [`tls`]), [`shm`] (same host: Unix socket, memfd arena, process_vm_readv/writev), `rdma`
//! (feature `rdma`, on by default: RC queue pairs over libibverbs, loaded at run time). [`AnyFabric`] picks one
//! per address (`unix:/path` is shm, `rdma:host:port` is rdma, `host:port` is tcp) so one client can mix them.

use std::future::Future;
use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use weft_proto::{Chunk, ChunkError, Region};

pub mod any;
mod peer;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod shm;
pub mod side_auth;
pub mod tcp;
pub mod tls;
pub mod zones;

pub use any::AnyFabric;
pub use shm::{Arena, ArenaBuf, ShmConfig, ShmFabric, ShmServerConfig};
pub use side_auth::{SideChannelAuth, SideStream};
pub use tcp::TcpFabric;
pub use tls::{TlsConfig, TlsError, TlsFiles};

/// What a fabric can do; the RPC layer chooses transfer methods from this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub name: &'static str,
    /// The peer's registered memory can be read and written without its CPU (RDMA READ/WRITE, shared memory).
    pub one_sided: bool,
    /// Registering memory pins its pages (`rdma`): a registration stays right only while the buffer it covers is
    /// alive (freed and reused virtual addresses may map other pages), so clients register exactly the pages of a
    /// call and drop the registration after it instead of caching it.
    pub pins_pages: bool,
}

/// Tears a connection down; pending reads and writes on both halves fail promptly.
pub trait Killer: Send + Sync + 'static {
    fn kill(&self);
}

pub struct Connection<F: Fabric> {
    pub reader: F::Reader,
    pub writer: F::Writer,
    pub killer: F::Killer,
    /// The peer's address, for logs.
    pub peer: String,
    /// Server side of a one-sided fabric: the client's registered memory, reachable with `get`/`put`. Dropping
    /// the last reference releases it (unmaps the arena): that happens when the connection ends.
    pub memory: Option<Arc<dyn PeerMemory>>,
    /// Under TLS: 32 bytes of the session's exporter (RFC 9266 `tls-exporter`), equal at both ends only when they
    /// share one TLS session. weft-rpc mixes it into the key handshake (docs/format.md §11), so a relay that
    /// terminates TLS on each side cannot forward the proofs. `None` on fabrics without a secure channel.
    pub channel_binding: Option<[u8; 32]>,
    /// Server side of `shm`: who the kernel says the peer is (SO_PEERCRED at accept). None on other fabrics.
    pub peer_cred: Option<PeerCred>,
}

/// The credentials of a local peer process, as the kernel reported them when it connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// The chunk list broke a rule; nothing was read or written.
    #[error("{0}")]
    Chunk(#[from] ChunkError),
    /// The transfer itself failed (e.g. the client unmapped memory it had registered).
    #[error("one-sided transfer failed: {0}")]
    Io(#[from] io::Error),
}

/// A client's registered memory as the server sees it. Methods block (a memory copy or a system call; an rdma
/// backend posts the work requests and waits for their completions): call them from a blocking thread.
pub trait PeerMemory: Send + Sync + 'static {
    /// Applies a registration batch from the client.
    fn register(&self, add: &[Region], remove: &[u32]) -> Result<(), ChunkError>;
    /// Checks a chunk list without moving data (so a bad request is refused before any disk work).
    fn check(&self, chunks: &[Chunk], want: u64) -> Result<(), ChunkError>;
    /// Copies the chunks, in order, into `dst` (whose length the chunks must add up to).
    fn get(&self, chunks: &[Chunk], dst: &mut [u8]) -> Result<(), MemoryError>;
    /// Copies `src` into the chunks, in order.
    fn put(&self, chunks: &[Chunk], src: &[u8]) -> Result<(), MemoryError>;
    /// The connection ended: every later `get`/`put` fails. The client may already reuse the memory.
    fn revoke(&self);
    /// Whether `get`/`put` want the server-side buffer inside an announced zone ([`zones`]): `rdma` can only move
    /// bytes to and from registered memory, so a buffer outside every zone costs a bounce copy. `shm` reaches any
    /// memory of its own process (a page-cache mapping included) and says false.
    fn wants_zone_buffers(&self) -> bool {
        false
    }
}

/// A local memory registration (an `rdma` memory region): the key a peer uses to reach it, and the handle that
/// keeps it registered until dropped.
pub struct LocalRegistration {
    pub rkey: u32,
    pub handle: Box<dyn std::any::Any + Send + Sync>,
}

pub trait Fabric: Clone + Send + Sync + 'static {
    type Reader: AsyncRead + Unpin + Send + 'static;
    type Writer: AsyncWrite + Unpin + Send + 'static;
    type Killer: Killer;
    type Listener: Listener<Self>;

    fn capabilities(&self) -> Capabilities;
    /// What a connection to `addr` can do (a fabric that spans backends answers per address).
    fn capabilities_of(&self, _addr: &str) -> Capabilities {
        self.capabilities()
    }
    /// The client's pre-registered arena, shared with every server it connects to over a one-sided fabric.
    fn arena(&self) -> Option<Arc<Arena>> {
        None
    }
    /// Registers `[addr, addr + len)` of this process (a client's pin-down window) with the fabric serving
    /// `peer`, for one-sided access by the server. `Ok(None)`: this fabric needs no local registration (`shm`
    /// reaches process memory by pid). The handle keeps the registration alive; dropping it deregisters.
    fn register_local(&self, _peer: &str, _addr: u64, _len: u64) -> io::Result<Option<LocalRegistration>> {
        Ok(None)
    }
    fn connect(&self, addr: &str) -> impl Future<Output = io::Result<Connection<Self>>> + Send;
    fn listen(&self, addr: &str) -> impl Future<Output = io::Result<Self::Listener>> + Send;
}

pub trait Listener<F: Fabric>: Send + 'static {
    fn accept(&mut self) -> impl Future<Output = io::Result<Connection<F>>> + Send;
    /// The bound address, e.g. after listening on port 0.
    fn local_addr(&self) -> io::Result<String>;
}

/// Counters of one-sided resources held by this process as a server (all connections, all listeners).
pub fn memory_stats() -> weft_proto::msg::FabricStat {
    peer::stats()
}

/// Raises this process's soft limit on open files (RLIMIT_NOFILE) to its hard limit, as servers with thousands of
/// connections need; returns the new soft limit.
pub fn raise_open_files_limit() -> io::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    }
    Ok(hard.max(soft))
}

/// Whether this process can use the `rdma` fabric: built with it, libibverbs loads and a device opens.
pub fn rdma_available() -> bool {
    #[cfg(feature = "rdma")]
    {
        rdma::available()
    }
    #[cfg(not(feature = "rdma"))]
    {
        false
    }
}

/// Identifies this machine: two processes with equal ids run on the same host (and can use `shm`).
pub fn host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}
