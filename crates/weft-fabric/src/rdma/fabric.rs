//! The `rdma` fabric: RPC Read-Write over an RC queue pair (InfiniBand, RoCE, Soft-RoCE).
//!
//! - A connection starts as a TCP side channel: both sides bring up two RC queue pairs over it
//!   ([`Endpoint::over_tcp`]), one for messages and one for the server's one-sided transfers, then the client
//!   sends a 32-byte hello naming its arena (address, length, rkey: the same [`Arena`] the `shm` fabric shares,
//!   registered once with this process's device). From then on the RPC frames travel as two-sided messages from
//!   pre-posted receives under credits ([`super::stream`]: a pump thread per connection), and the side channel
//!   only tells each end when the other is gone. Bulk data never rides in the messages: on a one-sided fabric
//!   the client names chunks for everything above the inline size class.
//! - The server's [`PeerMemory`] for the connection moves bulk data with RDMA READ (`get`) and RDMA WRITE (`put`)
//!   between its own buffers and the chunks the client named, after checking them against the regions the
//!   client registered (arena plus `Regions`, each with its rkey). Server buffers inside an announced zone
//!   ([`crate::zones`]) are registered once per process and used in place; any other buffer goes through a
//!   per-connection bounce region (one copy, counted in ARCHITECTURE.md's copy table).
//! - Clients register the exact pages of each large transfer for the length of the call
//!   ([`Capabilities::pins_pages`]): a cached registration would keep pinning the pages of a buffer the caller
//!   freed, and a new buffer at the same address would silently miss the data.
//!
//! - Before any queue pair or registration is made for a peer, the side channel runs the [`SideChannelAuth`]
//!   exchange the fabric was given (weft-rpc's HMAC challenge–response under the cluster key): a peer that cannot
//!   prove the key gets no queue pair. A server runs at most `handshakes_max` handshakes at once, and each must
//!   finish (authentication, both queue pairs, the hello) within `handshake_timeout_ms`, or its side channel is
//!   shut down. Server memory (zones, bounce regions) is registered for local access only and the server's queue
//!   pairs refuse remote access: only the server initiates transfers.
//!
//! The device is opened once per process (`WEFT_RDMA_DEVICE` names one; default: the first). Without libibverbs
//! or a device, connect and listen fail with `Unsupported` and a message saying why, never a panic.

use std::future::Future;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use weft_proto::chunk::ARENA_REGION;
use weft_proto::{Chunk, ChunkError, Region};

use super::stream::{self, StreamKiller, StreamReader, StreamWriter};
use super::wire::{ArenaHello, HELLO_BYTES};
use super::{Device, DeviceConfig, Endpoint, EndpointConfig, MemoryRegion, RdmaError, RemoteRegion};
use crate::peer::ClientRegions;
use crate::shm::{Arena, ShmFabric};
use crate::{
    Capabilities, Connection, Fabric, Killer, Listener, LocalRegistration, MemoryError, PeerMemory, SideChannelAuth,
};

/// Address prefix of rdma endpoints: `rdma:host:port` (the TCP side channel's address).
pub const RDMA_SCHEME: &str = "rdma:";
/// Default [`RdmaServerLimits::handshake_timeout_ms`].
pub const HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default [`RdmaServerLimits::handshakes_max`].
pub const HANDSHAKES_MAX_DEFAULT: u32 = 64;

/// What an rdma listener bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaServerLimits {
    /// Handshakes (authentication, queue pair setup, hello) in progress at once; more wait for a turn.
    pub handshakes_max: u32,
    /// The whole handshake, the wait for a turn included, must finish within this time.
    pub handshake_timeout_ms: u64,
}

impl Default for RdmaServerLimits {
    fn default() -> Self {
        RdmaServerLimits { handshakes_max: HANDSHAKES_MAX_DEFAULT, handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS_DEFAULT }
    }
}
/// Handshaken connections waiting for `accept`.
const ACCEPT_QUEUE: usize = 64;
/// Largest bounce region a connection keeps (the largest transfer it moves through one).
const BOUNCE_BYTES_MAX: usize = 16 << 20;
/// Largest single RDMA READ/WRITE work request (bigger transfers are pipelined in units of this).
const WORK_REQUEST_BYTES_MAX: usize = 1 << 20;

fn unsupported(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, format!("rdma fabric unavailable: {e}"))
}

fn to_io(e: RdmaError) -> io::Error {
    match e {
        RdmaError::Io(e) => e,
        RdmaError::Timeout { .. } => io::Error::new(io::ErrorKind::TimedOut, e.to_string()),
        other => io::Error::other(other.to_string()),
    }
}

/// The process's verbs device, opened on first use.
fn device() -> io::Result<Device> {
    static DEVICE: OnceLock<Result<Device, String>> = OnceLock::new();
    DEVICE
        .get_or_init(|| {
            let name = std::env::var("WEFT_RDMA_DEVICE").ok().filter(|s| !s.is_empty());
            Device::open(&DeviceConfig { name, ..DeviceConfig::default() }).map_err(|e| e.to_string())
        })
        .clone()
        .map_err(unsupported)
}

/// Whether this process can use the rdma fabric (libibverbs loads and a device opens).
pub fn available() -> bool {
    device().is_ok()
}

/// The message queue pair: 16 receives of 16 KiB each way (an RPC header and body, or an inline payload of up
/// to 4 KiB, fits in one message; longer frames span several). Completions wake the pump through the channel.
fn message_config() -> EndpointConfig {
    EndpointConfig {
        recv_credits: 16,
        msg_bytes_max: (16 << 10) + super::MSG_HEADER_BYTES as u32,
        send_slots: 16,
        transfer_unit_bytes: WORK_REQUEST_BYTES_MAX,
        timeout_ms: 30_000,
        evented: true,
        remote_access: false,
    }
}

/// The transfer queue pair: one-sided only, so one tiny receive; a server thread waiting for its transfer's
/// completions sleeps on the channel instead of spinning. Only the client's end admits remote access (the
/// server reads and writes the client's memory, never the other way).
fn transfer_config(remote_access: bool) -> EndpointConfig {
    EndpointConfig {
        recv_credits: 1,
        msg_bytes_max: 64 + super::MSG_HEADER_BYTES as u32,
        send_slots: 1,
        transfer_unit_bytes: WORK_REQUEST_BYTES_MAX,
        timeout_ms: 30_000,
        evented: true,
        remote_access,
    }
}

/// The client's arena registered with the device (once per process). Field order is drop order: the
/// registration goes before the memory it covers.
struct ArenaRegistration {
    mr: MemoryRegion,
    _arena: Arc<Arena>,
}

/// Client side: connects to `rdma:host:port` and registers the arena shared with the `shm` fabric.
#[derive(Clone, Default)]
pub struct RdmaFabric {
    arena_source: ShmFabric,
    arena_reg: Arc<Mutex<Option<Arc<ArenaRegistration>>>>,
    /// Runs first on every side channel, both ways; None: no authentication (`auth = "none"`).
    auth: Option<Arc<dyn SideChannelAuth>>,
    limits: RdmaServerLimits,
}

impl RdmaFabric {
    /// A fabric whose connections advertise the arena of `arena_source` (so one client has one arena).
    pub fn new(arena_source: ShmFabric) -> RdmaFabric {
        RdmaFabric { arena_source, arena_reg: Arc::default(), auth: None, limits: RdmaServerLimits::default() }
    }

    /// The same fabric, authenticating every side channel with `auth` before any queue pair exists.
    pub fn with_side_channel_auth(mut self, auth: Option<Arc<dyn SideChannelAuth>>) -> RdmaFabric {
        self.auth = auth;
        self
    }

    /// The same fabric, its listeners bounded by `limits`.
    pub fn with_limits(mut self, limits: RdmaServerLimits) -> RdmaFabric {
        self.limits = limits;
        self
    }

    fn arena_registration(&self, dev: &Device) -> io::Result<Arc<ArenaRegistration>> {
        let mut slot = self.arena_reg.lock().expect("arena registration");
        if let Some(r) = slot.as_ref() {
            return Ok(r.clone());
        }
        let arena = self.arena_source.arena_or_create()?;
        // SAFETY: the arena's mapping lives as long as the Arc kept beside the registration (dropped after it);
        // only its address and keys are used, the arena's own copies stay the only Rust access to its bytes.
        let mr = unsafe { MemoryRegion::register_external(dev, arena.base_ptr(), arena.len(), true) }.map_err(to_io)?;
        let r = Arc::new(ArenaRegistration { mr, _arena: arena });
        *slot = Some(r.clone());
        Ok(r)
    }
}

fn host_port(addr: &str) -> &str {
    addr.strip_prefix(RDMA_SCHEME).unwrap_or(addr)
}

/// The client's side of the transfer queue pair: kept alive with the connection's reader (the server does every
/// transfer, so the client only has to keep its QP, and the arena it advertised, in existence).
struct ClientQp {
    _ep: Mutex<Endpoint>,
    _arena: Arc<ArenaRegistration>,
}

/// The RPC stream of an rdma connection (client side: also keeps its transfer QP alive).
pub struct RdmaReader {
    inner: StreamReader,
    _qp: Option<Arc<ClientQp>>,
}

impl AsyncRead for RdmaReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

/// Hands a connected side channel to a blocking thread for the queue pair setup (bounded by `timeout_ms` on every
/// read and write; the caller's deadline shuts the socket down to end it sooner).
async fn blocking_setup<T: Send + 'static>(
    stream: TcpStream,
    timeout_ms: u64,
    f: impl FnOnce(&mut std::net::TcpStream) -> io::Result<T> + Send + 'static,
) -> io::Result<(std::net::TcpStream, T)> {
    let mut side = stream.into_std()?;
    side.set_nonblocking(false)?;
    side.set_nodelay(true)?;
    let timeout = Some(Duration::from_millis(timeout_ms.max(1)));
    side.set_read_timeout(timeout)?;
    side.set_write_timeout(timeout)?;
    let (side, out) = tokio::task::spawn_blocking(move || f(&mut side).map(|t| (side, t)))
        .await
        .map_err(|e| io::Error::other(format!("rdma handshake task: {e}")))??;
    side.set_read_timeout(None)?;
    side.set_write_timeout(None)?;
    Ok((side, out))
}

impl Fabric for RdmaFabric {
    type Reader = RdmaReader;
    type Writer = StreamWriter;
    type Killer = StreamKiller;
    type Listener = RdmaListener;

    fn capabilities(&self) -> Capabilities {
        Capabilities { name: "rdma", one_sided: true, pins_pages: true }
    }

    fn arena(&self) -> Option<Arc<Arena>> {
        self.arena_source.arena()
    }

    fn register_local(&self, _peer: &str, addr: u64, len: u64) -> io::Result<Option<LocalRegistration>> {
        let dev = device()?;
        let len = usize::try_from(len).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "region too large"))?;
        // SAFETY: the caller (the pin-down cache) registers the pages of a buffer a call holds for its whole
        // length, and drops the registration when the call ends; the device pins the pages meanwhile.
        let mr = unsafe { MemoryRegion::register_external(&dev, addr as *mut u8, len, true) }.map_err(to_io)?;
        Ok(Some(LocalRegistration { rkey: mr.rkey(), handle: Box::new(mr) }))
    }

    async fn connect(&self, addr: &str) -> io::Result<Connection<Self>> {
        let dev = device()?;
        let arena = self.arena_registration(&dev)?;
        let mut stream = TcpStream::connect(host_port(addr)).await?;
        let peer =
            format!("{RDMA_SCHEME}{}", stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| addr.into()));
        if let Some(auth) = &self.auth {
            let deadline = Duration::from_millis(self.limits.handshake_timeout_ms);
            let proved = tokio::time::timeout(deadline, auth.client(&mut stream)).await.unwrap_or_else(|_| {
                Err(io::Error::new(io::ErrorKind::TimedOut, "side-channel authentication timed out"))
            });
            if let Err(e) = proved {
                tracing::warn!(%peer, "rdma side-channel authentication failed, no queue pair made: {e}");
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("rdma side-channel authentication with {peer} failed: {e}"),
                ));
            }
        }
        let hello = ArenaHello { addr: arena.mr.addr(), len: arena.mr.len() as u64, rkey: arena.mr.rkey() }.encode();
        let (side, (messages, transfers)) = blocking_setup(stream, self.limits.handshake_timeout_ms, move |s| {
            let messages = Endpoint::over_tcp(&dev, s, message_config()).map_err(to_io)?;
            let transfers = Endpoint::over_tcp(&dev, s, transfer_config(true)).map_err(to_io)?;
            s.write_all(&hello)?;
            Ok((messages, transfers))
        })
        .await?;
        let qp = Arc::new(ClientQp { _ep: Mutex::new(transfers), _arena: arena });
        let (reader, writer, killer) = stream::start(messages, side, peer.clone())?;
        Ok(Connection {
            reader: RdmaReader { inner: reader, _qp: Some(qp) },
            writer,
            killer,
            peer,
            memory: None,
            peer_cred: None,
            channel_binding: None,
        })
    }

    async fn listen(&self, addr: &str) -> io::Result<RdmaListener> {
        let dev = device()?;
        let listener = TcpListener::bind(host_port(addr)).await?;
        let local = format!("{RDMA_SCHEME}{}", listener.local_addr()?);
        let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
        let gate = HandshakeGate::new(self.limits);
        let task = tokio::spawn(accept_loop(listener, dev, tx, gate, self.auth.clone()));
        Ok(RdmaListener { rx, addr: local, task })
    }
}

/// Bounds a listener's handshakes: how many run at once, and how long each may take (the wait for a turn
/// included).
#[derive(Clone)]
struct HandshakeGate {
    permits: Arc<Semaphore>,
    limits: RdmaServerLimits,
}

impl HandshakeGate {
    fn new(limits: RdmaServerLimits) -> HandshakeGate {
        HandshakeGate { permits: Arc::new(Semaphore::new(limits.handshakes_max.max(1) as usize)), limits }
    }

    /// Runs `handshake` once a turn is free, all within the deadline. On a missed deadline `abandon` runs (it
    /// shuts the side channel down, so a blocking setup thread stops at its next read or write).
    async fn run<T>(&self, handshake: impl Future<Output = io::Result<T>>, abandon: impl FnOnce()) -> io::Result<T> {
        let timeout_ms = self.limits.handshake_timeout_ms;
        let bounded = async {
            let _turn = self.permits.acquire().await.map_err(|_| io::Error::other("handshake gate closed"))?;
            handshake.await
        };
        match tokio::time::timeout(Duration::from_millis(timeout_ms), bounded).await {
            Ok(r) => r,
            Err(_) => {
                abandon();
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "handshake not finished within {timeout_ms} ms (at most {} run at once)",
                        self.limits.handshakes_max
                    ),
                ))
            }
        }
    }
}

/// Accepts side-channel connections and runs each handshake on its own task, so a client that stalls in the
/// middle of one blocks nobody else. A failed handshake is logged here and never reaches `accept`.
async fn accept_loop(
    listener: TcpListener,
    dev: Device,
    tx: mpsc::Sender<io::Result<Connection<RdmaFabric>>>,
    gate: HandshakeGate,
    auth: Option<Arc<dyn SideChannelAuth>>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                if tx.send(Err(e)).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
                continue;
            }
        };
        let tx = tx.clone();
        let dev = dev.clone();
        let gate = gate.clone();
        let auth = auth.clone();
        tokio::spawn(async move {
            let shut = match stream.as_fd().try_clone_to_owned() {
                Ok(fd) => fd,
                Err(e) => {
                    tracing::warn!(%peer, "rdma connection refused: {e}");
                    return;
                }
            };
            let name = format!("{RDMA_SCHEME}{peer}");
            let timeout_ms = gate.limits.handshake_timeout_ms;
            let r = gate
                .run(handshake(stream, name, dev, auth, timeout_ms), || {
                    let _ = socket2::SockRef::from(&shut).shutdown(std::net::Shutdown::Both);
                })
                .await;
            match r {
                Ok(c) => {
                    let _ = tx.send(Ok(c)).await;
                }
                Err(e) => tracing::warn!(%peer, "rdma connection refused: {e}"),
            }
        });
    }
}

async fn handshake(
    mut stream: TcpStream,
    peer: String,
    dev: Device,
    auth: Option<Arc<dyn SideChannelAuth>>,
    timeout_ms: u64,
) -> io::Result<Connection<RdmaFabric>> {
    if let Some(auth) = &auth {
        auth.server(&mut stream, &peer).await.map_err(|e| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("side-channel authentication failed, no queue pair made: {e}"),
            )
        })?;
    }
    let dev2 = dev.clone();
    let (side, (messages, transfers, hello)) = blocking_setup(stream, timeout_ms, move |s| {
        let messages = Endpoint::over_tcp(&dev2, s, message_config()).map_err(to_io)?;
        let transfers = Endpoint::over_tcp(&dev2, s, transfer_config(false)).map_err(to_io)?;
        let mut hello = [0u8; HELLO_BYTES];
        s.read_exact(&mut hello)?;
        Ok((messages, transfers, hello))
    })
    .await?;
    let hello = ArenaHello::decode(&hello).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    let arena = Region { id: ARENA_REGION, addr: hello.addr, len: hello.len, rkey: hello.rkey };
    tracing::info!(%peer, arena_bytes = arena.len, authenticated = auth.is_some(), "rdma connection up");
    let (reader, writer, killer) = stream::start(messages, side, peer.clone())?;
    let memory = Arc::new(RdmaPeer::new(dev, transfers, arena, peer.clone(), killer.try_clone()?));
    Ok(Connection {
        reader: RdmaReader { inner: reader, _qp: None },
        writer,
        killer,
        peer,
        memory: Some(memory),
        peer_cred: None,
        channel_binding: None,
    })
}

pub struct RdmaListener {
    rx: mpsc::Receiver<io::Result<Connection<RdmaFabric>>>,
    addr: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RdmaListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener<RdmaFabric> for RdmaListener {
    async fn accept(&mut self) -> io::Result<Connection<RdmaFabric>> {
        self.rx.recv().await.unwrap_or_else(|| Err(io::Error::other("rdma accept loop ended")))
    }

    fn local_addr(&self) -> io::Result<String> {
        Ok(self.addr.clone())
    }
}

/// The server zone holding `[ptr, ptr + len)` registered with `dev`, and the span's offset in it: registered once
/// per zone and device (protection domain), kept for the life of the process (zones are never withdrawn, see
/// [`crate::zones`]). `None` when the span is in no zone or the registration fails (the caller bounces).
/// Used by Weft's own rdma fabric and by the NFS-over-RDMA transport (whose RDMA CM devices are their own PDs).
pub fn zone_region(dev: &Device, ptr: *const u8, len: usize) -> Option<(Arc<MemoryRegion>, usize)> {
    static ZONE_MRS: Mutex<Vec<(usize, usize, Arc<MemoryRegion>)>> = Mutex::new(Vec::new());
    let zone = crate::zones::find(ptr, len)?;
    let offset = ptr as usize - zone.addr;
    // A device is named by its shared state; a registration keeps that alive, so the address is never reused
    // while the entry exists.
    let dev_key = Arc::as_ptr(&dev.inner) as usize;
    let mut mrs = ZONE_MRS.lock().expect("zone registrations");
    if let Some((_, _, mr)) = mrs.iter().find(|(a, d, _)| *a == zone.addr && *d == dev_key) {
        return Some((mr.clone(), offset));
    }
    // SAFETY: an announced zone stays mapped for the life of the process (the `zones` contract); the region is
    // used only through addresses and keys, by transfers whose target range the caller holds exclusively.
    // Local access only: the server initiates every transfer, so no peer ever gets a key to its memory.
    match unsafe { MemoryRegion::register_external(dev, zone.addr as *mut u8, zone.len, false) } {
        Ok(mr) => {
            tracing::info!(bytes = zone.len, "rdma: server zone registered");
            let mr = Arc::new(mr);
            mrs.push((zone.addr, dev_key, mr.clone()));
            Some((mr, offset))
        }
        Err(e) => {
            tracing::warn!(bytes = zone.len, "rdma: zone registration failed, bouncing through a copy: {e}");
            None
        }
    }
}

/// The queue pair a server moves one client's data on, and its bounce region.
struct PeerQp {
    ep: Endpoint,
    bounce: Option<MemoryRegion>,
    /// A transfer failed: the QP is in the error state (or has work in flight) and must not be used again.
    broken: bool,
}

/// Which way a transfer goes.
#[derive(Clone, Copy)]
enum Dir {
    /// RDMA READ: client memory → server buffer (`get`).
    Read,
    /// RDMA WRITE: server buffer → client memory (`put`).
    Write,
}

/// One client connection's memory as the server sees it: its regions (with rkeys) and the queue pair.
struct RdmaPeer {
    dev: Device,
    qp: Mutex<PeerQp>,
    regions: ClientRegions,
    /// Ends the connection when its queue pair fails, so the client reconnects instead of failing every
    /// later transfer on a retired pair.
    killer: StreamKiller,
    peer: String,
    /// Bytes moved by RDMA READ (client → server) and RDMA WRITE (server → client), and how many of them went
    /// through the bounce region: logged when the connection ends.
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    bytes_bounced: AtomicU64,
}

impl RdmaPeer {
    fn new(dev: Device, ep: Endpoint, arena: Region, peer: String, killer: StreamKiller) -> RdmaPeer {
        RdmaPeer {
            dev,
            qp: Mutex::new(PeerQp { ep, bounce: None, broken: false }),
            regions: ClientRegions::new(Some(arena)),
            killer,
            peer,
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            bytes_bounced: AtomicU64::new(0),
        }
    }

    /// Moves `local` (the server's buffer) to or from the client's `chunks`, after checking them. A server
    /// buffer inside an announced zone is used in place; any other goes through the bounce region (one copy).
    /// A failed RDMA operation retires the queue pair and ends the connection.
    fn transfer(&self, dir: Dir, chunks: &[Chunk], local: Local<'_>) -> Result<(), MemoryError> {
        let len = local.len();
        let remote = self.regions.resolve(chunks, len as u64, |r, c| RemoteRegion {
            addr: r.addr + c.offset,
            len: u64::from(c.len),
            rkey: r.rkey,
        })?;
        let mut q = self.qp.lock().expect("queue pair");
        if q.broken {
            return Err(MemoryError::Io(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "an earlier transfer on this connection failed",
            )));
        }
        let PeerQp { ep, bounce, broken } = &mut *q;
        let moved = match zone_region(&self.dev, local.ptr(), len) {
            // SAFETY: `local` is borrowed (mutably for a read) for this whole call, so no other reference to
            // those bytes exists while the RDMA READ fills them.
            Some((mr, offset)) => match dir {
                Dir::Read => unsafe { ep.read_chunks_shared(&mr, offset, &remote) },
                Dir::Write => ep.write_chunks(&mr, offset, &remote),
            },
            None => {
                let mut tmp = take_bounce(bounce, &self.dev, len)?;
                let r = match local {
                    Local::Dst(dst) => ep.read_chunks(&mut tmp, 0, &remote).map(|()| {
                        dst.copy_from_slice(&tmp.as_slice()[..len]);
                    }),
                    Local::Src(src) => {
                        tmp.as_mut_slice()[..len].copy_from_slice(src);
                        ep.write_chunks(&tmp, 0, &remote)
                    }
                };
                *bounce = Some(tmp);
                if r.is_ok() {
                    self.bytes_bounced.fetch_add(len as u64, Ordering::Relaxed);
                }
                r
            }
        };
        match moved {
            Ok(()) => {
                let counter = if matches!(dir, Dir::Read) { &self.bytes_read } else { &self.bytes_written };
                counter.fetch_add(len as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                *broken = true;
                let op = if matches!(dir, Dir::Read) { "read" } else { "write" };
                tracing::warn!(peer = %self.peer, "rdma {op} failed; retiring the connection: {e}");
                self.killer.kill();
                Err(MemoryError::Io(to_io(e)))
            }
        }
    }
}

/// The server's side of a transfer.
enum Local<'a> {
    Dst(&'a mut [u8]),
    Src(&'a [u8]),
}

impl Local<'_> {
    fn len(&self) -> usize {
        match self {
            Local::Dst(d) => d.len(),
            Local::Src(s) => s.len(),
        }
    }
    fn ptr(&self) -> *const u8 {
        match self {
            Local::Dst(d) => d.as_ptr(),
            Local::Src(s) => s.as_ptr(),
        }
    }
}

/// Takes the bounce region out of `slot` (growing it to hold `len` bytes); the caller puts it back. Failing here
/// moved nothing, so the queue pair stays usable.
fn take_bounce(slot: &mut Option<MemoryRegion>, dev: &Device, len: usize) -> Result<MemoryRegion, MemoryError> {
    if len > BOUNCE_BYTES_MAX {
        return Err(MemoryError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("transfer of {len} bytes exceeds the bounce region's {BOUNCE_BYTES_MAX}"),
        )));
    }
    match slot.take() {
        Some(b) if b.len() >= len => Ok(b),
        _ => {
            let size = len.next_power_of_two().max(64 << 10);
            MemoryRegion::new(dev, size, false, false).map_err(|e| MemoryError::Io(to_io(e)))
        }
    }
}

impl Drop for RdmaPeer {
    fn drop(&mut self) {
        tracing::info!(
            peer = %self.peer,
            bytes_read = self.bytes_read.load(Ordering::Relaxed),
            bytes_written = self.bytes_written.load(Ordering::Relaxed),
            bytes_bounced = self.bytes_bounced.load(Ordering::Relaxed),
            "rdma connection closed"
        );
    }
}

impl PeerMemory for RdmaPeer {
    fn register(&self, add: &[Region], remove: &[u32]) -> Result<(), ChunkError> {
        self.regions.register(add, remove)
    }

    fn check(&self, chunks: &[Chunk], want: u64) -> Result<(), ChunkError> {
        self.regions.check(chunks, want)
    }

    fn get(&self, chunks: &[Chunk], dst: &mut [u8]) -> Result<(), MemoryError> {
        self.transfer(Dir::Read, chunks, Local::Dst(dst))
    }

    fn put(&self, chunks: &[Chunk], src: &[u8]) -> Result<(), MemoryError> {
        self.transfer(Dir::Write, chunks, Local::Src(src))
    }

    fn revoke(&self) {
        self.regions.revoke();
    }

    fn wants_zone_buffers(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_is_checked() {
        let h = ArenaHello { addr: 0x1000, len: 4 << 20, rkey: 7 };
        assert_eq!(ArenaHello::decode(&h.encode()).unwrap(), h);
        let bad = |addr, len| ArenaHello::decode(&ArenaHello { addr, len, rkey: 7 }.encode()).is_err();
        assert!(bad(0x1000, 0), "empty arena");
        assert!(bad(u64::MAX, 2), "wraps");
        assert!(bad(0, super::super::wire::ARENA_BYTES_MAX + 1), "too large");
        let mut e = h.encode();
        e[0] = b'X';
        assert!(ArenaHello::decode(&e).is_err(), "bad magic");
        assert!(ArenaHello::decode(&e[..31]).is_err(), "short");
    }

    #[tokio::test]
    async fn without_a_device_connect_and_listen_fail_cleanly() {
        if available() {
            return; // a host with a device (the Soft-RoCE VM) exercises the real path instead
        }
        let f = RdmaFabric::default();
        let e = f.listen("rdma:127.0.0.1:0").await.err().expect("no device: listen fails");
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
        let e = f.connect("rdma:127.0.0.1:9").await.err().expect("no device: connect fails");
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
    }

    #[tokio::test]
    async fn handshakes_are_bounded_in_number_and_time() {
        let gate = HandshakeGate::new(RdmaServerLimits { handshakes_max: 1, handshake_timeout_ms: 200 });
        // One handshake holds the only turn and never finishes: it is abandoned at the deadline.
        let (hold_tx, hold_rx) = tokio::sync::oneshot::channel::<()>();
        let g = gate.clone();
        let abandoned = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let a = abandoned.clone();
        let first = tokio::spawn(async move {
            g.run(
                async {
                    let _ = hold_rx.await;
                    Ok(())
                },
                move || a.store(true, Ordering::SeqCst),
            )
            .await
        });
        while gate.permits.available_permits() > 0 {
            tokio::task::yield_now().await; // until the first holds the turn
        }
        // A second one waits for the turn and runs out of time without ever starting.
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = started.clone();
        let second = gate
            .run(
                async move {
                    s.store(true, Ordering::SeqCst);
                    Ok(())
                },
                || {},
            )
            .await;
        assert_eq!(second.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(!started.load(Ordering::SeqCst), "no turn was free");
        let first = first.await.unwrap();
        assert_eq!(first.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(abandoned.load(Ordering::SeqCst), "the stalled handshake's side channel is shut down");
        drop(hold_tx);
        // The turn is free again.
        gate.run(async { Ok(()) }, || {}).await.unwrap();
    }
}
