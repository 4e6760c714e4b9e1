//! The `shm` backend: one-sided transfers between processes on the same host.
//!
//! - Messages (the RPC frames) travel over a Unix stream socket; servers listen on `unix:/path` beside their TCP
//!   port and announce the path in `FabricInfo` (the data server puts it at `DATA_ROOT/weft-data.sock`).
//! - The client's pre-registered I/O memory is an [`Arena`]: a memfd, sealed against shrinking, cut into
//!   `buffer_bytes` buffers. Its descriptor travels once per connection in the hello (SCM_RIGHTS); the server
//!   checks the seal and size, maps it shared and populated, and reaches it by plain copies as region 0.
//! - Memory outside the arena (the caller's own buffers for large transfers) is registered as process-memory
//!   regions (`Regions` op) and reached with process_vm_readv/writev. The peer's pid comes from SO_PEERCRED,
//!   never from the client's word, so a client can only ever point the server at its own address space.
//! - When the connection ends, the [`PeerMemory`] is dropped: the arena is unmapped and the regions forgotten.
//! - Who may connect: the socket file is created mode 0600 (0660 with `socket_group`), so the kernel refuses
//!   other users' `connect`. The peer's uid, gid and pid (SO_PEERCRED) travel with the connection
//!   ([`crate::Connection::peer_cred`]) for the services to check against the key the peer proves. The peer's
//!   process is held as a pidfd from the hello on and checked before every process_vm transfer, so a pid
//!   reused after the client died is never read or written. The arena's size is bounded (`arena_bytes_max`).
//!
//! All `unsafe` of the backend is in [`sys`].

mod sys;

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use weft_proto::chunk::ARENA_REGION;
use weft_proto::{Chunk, ChunkError, Region};

use crate::peer::ClientRegions;
use crate::{Capabilities, Connection, Fabric, Killer, Listener, MemoryError, PeerCred, PeerMemory};

/// Address prefix of shm endpoints: `unix:/run/weft/data.sock`.
pub const SHM_SCHEME: &str = "unix:";
const HELLO_MAGIC: &[u8; 8] = b"WFTSHM01";
const HELLO_LEN: usize = 16;
/// A client that connects but sends no hello within this time is dropped.
const HELLO_TIMEOUT_MS: u64 = 10_000;
/// Handshaken connections waiting for `accept`.
const ACCEPT_QUEUE: usize = 64;

/// Server-side rules of the shm listener (the data server's `shm_socket_group` and `shm_arena_bytes_max`).
#[derive(Debug, Clone)]
pub struct ShmServerConfig {
    /// Group (name or number) that may connect too: the socket file is then mode 0660 in that group; without
    /// one it is 0600 (only this server's user, and root).
    pub socket_group: Option<String>,
    /// Largest arena a client may hand over; a larger hello is refused.
    pub arena_bytes_max: u64,
}

/// Default [`ShmServerConfig::arena_bytes_max`]: 256 MiB (a default client's arena is 4 MiB).
pub const ARENA_BYTES_MAX_DEFAULT: u64 = 256 << 20;

impl Default for ShmServerConfig {
    fn default() -> Self {
        ShmServerConfig { socket_group: None, arena_bytes_max: ARENA_BYTES_MAX_DEFAULT }
    }
}

/// Client-side sizes of the arena (the "pre-registered buffers" size class).
#[derive(Debug, Clone, Copy)]
pub struct ShmConfig {
    /// Buffers in the arena: the most medium-sized transfers in flight at once over all shm servers.
    pub arena_buffers: u32,
    /// Size of each arena buffer: the largest transfer staged through the arena (64 KiB in the papers).
    pub buffer_bytes: usize,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig { arena_buffers: 64, buffer_bytes: 64 << 10 }
    }
}

/// Pre-registered client memory shared with shm servers: a sealed memfd cut into equal buffers, bounded.
pub struct Arena {
    fd: OwnedFd,
    map: sys::SharedMap,
    buf_bytes: usize,
    free: Mutex<Vec<u32>>,
    permits: Arc<Semaphore>,
}

/// One arena buffer on loan; returns on drop. Touched only by copies (`copy_in`/`copy_out`), because the server
/// writes it from another process while a request is in flight.
pub struct ArenaBuf {
    arena: Arc<Arena>,
    index: u32,
    len: usize,
    _permit: OwnedSemaphorePermit,
}

impl Arena {
    pub fn create(cfg: ShmConfig) -> io::Result<Arc<Arena>> {
        let buffers = cfg.arena_buffers.max(1);
        let len = (buffers as u64) * (cfg.buffer_bytes.max(4096) as u64);
        let fd = sys::create_arena_fd(len)?;
        let map = sys::SharedMap::map(&fd, len)?;
        Ok(Arc::new(Arena {
            fd,
            map,
            buf_bytes: cfg.buffer_bytes.max(4096),
            free: Mutex::new((0..buffers).rev().collect()),
            permits: Arc::new(Semaphore::new(buffers as usize)),
        }))
    }

    pub fn buf_bytes(&self) -> usize {
        self.buf_bytes
    }

    /// The arena's base address in this process (the `rdma` fabric registers the whole arena with its device).
    pub fn base_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Borrows a buffer with `len` bytes in use (≤ `buf_bytes`); waits while all are out (back-pressure).
    pub async fn acquire(self: &Arc<Self>, len: usize) -> ArenaBuf {
        assert!(len <= self.buf_bytes, "arena buffer of {len} bytes asked from buffers of {}", self.buf_bytes);
        let permit = self.permits.clone().acquire_owned().await.expect("arena semaphore is never closed");
        let index = self.free.lock().expect("arena").pop().expect("a permit guarantees a free buffer");
        ArenaBuf { arena: self.clone(), index, len, _permit: permit }
    }
}

impl ArenaBuf {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    fn base(&self) -> u64 {
        self.index as u64 * self.arena.buf_bytes as u64
    }
    /// The chunk naming `[offset, offset + len)` of this buffer in the arena region.
    pub fn chunk(&self, offset: usize, len: usize) -> Chunk {
        assert!(offset + len <= self.len);
        Chunk { region: ARENA_REGION, offset: self.base() + offset as u64, len: len as u32 }
    }
    pub fn copy_in(&mut self, offset: usize, src: &[u8]) {
        assert!(offset + src.len() <= self.len);
        self.arena.map.copy_in(self.base() + offset as u64, src).expect("inside the arena by construction");
    }
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) {
        assert!(offset + dst.len() <= self.len);
        self.arena.map.copy_out(self.base() + offset as u64, dst).expect("inside the arena by construction");
    }
}

impl Drop for ArenaBuf {
    fn drop(&mut self) {
        if let Ok(mut f) = self.arena.free.lock() {
            f.push(self.index);
        }
    }
}

/// Client side: connects over a Unix socket and shares one arena (created on first use) with every server.
#[derive(Clone, Default)]
pub struct ShmFabric {
    pub cfg: ShmConfig,
    /// What `listen` enforces.
    pub server: Arc<ShmServerConfig>,
    arena: Arc<Mutex<Option<Arc<Arena>>>>,
}

impl ShmFabric {
    pub fn new(cfg: ShmConfig) -> ShmFabric {
        ShmFabric { cfg, server: Arc::default(), arena: Arc::default() }
    }

    /// The same fabric with the listener's rules `server`.
    pub fn with_server(mut self, server: ShmServerConfig) -> ShmFabric {
        self.server = Arc::new(server);
        self
    }

    pub(crate) fn arena_or_create(&self) -> io::Result<Arc<Arena>> {
        let mut a = self.arena.lock().expect("arena");
        if let Some(a) = a.as_ref() {
            return Ok(a.clone());
        }
        let created = Arena::create(self.cfg)?;
        *a = Some(created.clone());
        Ok(created)
    }
}

fn path_of(addr: &str) -> &str {
    addr.strip_prefix(SHM_SCHEME).unwrap_or(addr)
}

/// A duplicate of the socket: `shutdown(2)` on it ends both halves.
pub struct ShmKiller(OwnedFd);

impl Killer for ShmKiller {
    fn kill(&self) {
        // Already shut down or reset: dead either way.
        let _ = socket2::SockRef::from(&self.0).shutdown(std::net::Shutdown::Both);
    }
}

fn split(
    stream: UnixStream,
    peer: String,
    memory: Option<Arc<dyn PeerMemory>>,
    peer_cred: Option<PeerCred>,
) -> io::Result<Connection<ShmFabric>> {
    let killer = ShmKiller(stream.as_fd().try_clone_to_owned()?);
    let (reader, writer) = stream.into_split();
    Ok(Connection { reader, writer, killer, peer, memory, peer_cred, channel_binding: None })
}

impl Fabric for ShmFabric {
    type Reader = OwnedReadHalf;
    type Writer = OwnedWriteHalf;
    type Killer = ShmKiller;
    type Listener = ShmListener;

    fn capabilities(&self) -> Capabilities {
        Capabilities { name: "shm", one_sided: true, pins_pages: false }
    }

    fn arena(&self) -> Option<Arc<Arena>> {
        self.arena_or_create().ok()
    }

    async fn connect(&self, addr: &str) -> io::Result<Connection<Self>> {
        let arena = self.arena_or_create()?;
        let stream = UnixStream::connect(path_of(addr)).await?;
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(HELLO_MAGIC);
        hello[8..].copy_from_slice(&(arena.len() as u64).to_le_bytes());
        loop {
            stream.writable().await?;
            match stream
                .try_io(Interest::WRITABLE, || sys::send_hello(stream.as_raw_fd(), &hello, Some(arena.fd.as_raw_fd())))
            {
                Ok(HELLO_LEN) => break,
                Ok(n) => return Err(io::Error::other(format!("short hello: {n} bytes sent"))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        split(stream, addr.to_string(), None, None)
    }

    async fn listen(&self, addr: &str) -> io::Result<ShmListener> {
        let path = path_of(addr).to_string();
        let gid = self.server.socket_group.as_deref().map(sys::group_id).transpose()?;
        let mode = if gid.is_some() { 0o660 } else { 0o600 };
        // A socket file left by a previous run of this server would make bind fail; anything else is kept.
        remove_stale_socket(&path)?;
        // Bound under a temporary name, given its mode and group, then renamed: the public name never exists
        // with the umask's mode, so no other user can connect in between.
        let staging = format!("{path}.{}.tmp", std::process::id());
        remove_stale_socket(&staging)?;
        let listener = UnixListener::bind(&staging)?;
        let published = sys::set_socket_mode(std::path::Path::new(&staging), mode, gid)
            .and_then(|()| std::fs::rename(&staging, &path));
        if let Err(e) = published {
            let _ = std::fs::remove_file(&staging);
            return Err(e);
        }
        tracing::info!(%path, mode = format_args!("{mode:04o}"), group = ?self.server.socket_group, "shm socket");
        let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
        let task = tokio::spawn(accept_loop(listener, tx, self.server.clone()));
        Ok(ShmListener { rx, addr: format!("{SHM_SCHEME}{path}"), task })
    }
}

fn remove_stale_socket(path: &str) -> io::Result<()> {
    if let Ok(m) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if m.file_type().is_socket() {
            std::fs::remove_file(path)?;
        }
    }
    Ok(())
}

/// Accepts connections and runs each hello on its own task, so a client that never sends one blocks nobody. A
/// failed hello is logged here and never reaches `accept` (whose caller pauses after errors).
async fn accept_loop(
    listener: UnixListener,
    tx: mpsc::Sender<io::Result<Connection<ShmFabric>>>,
    server: Arc<ShmServerConfig>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                if tx.send(Err(e)).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
                continue;
            }
        };
        let tx = tx.clone();
        let server = server.clone();
        tokio::spawn(async move {
            let r = tokio::time::timeout(Duration::from_millis(HELLO_TIMEOUT_MS), handshake(stream, &server)).await;
            match r.unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "no hello from the client"))) {
                Ok(c) => {
                    let _ = tx.send(Ok(c)).await;
                }
                Err(e) => tracing::warn!("shm connection refused: {e}"),
            }
        });
    }
}

async fn handshake(stream: UnixStream, server: &ShmServerConfig) -> io::Result<Connection<ShmFabric>> {
    let cred = stream.peer_cred()?;
    let pid = cred.pid().ok_or_else(|| io::Error::other("the peer's pid is unknown (SO_PEERCRED)"))?;
    let peer_cred = PeerCred { uid: cred.uid(), gid: cred.gid(), pid };
    let pidfd = sys::peer_pidfd(&stream, pid)
        .map_err(|e| io::Error::other(format!("cannot hold the peer's process (pid {pid}) as a pidfd: {e}")))?;
    let mut hello = [0u8; HELLO_LEN];
    let (n, fd) = loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || sys::recv_hello(stream.as_raw_fd(), &mut hello)) {
            Ok(x) => break x,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    if n != HELLO_LEN || &hello[..8] != HELLO_MAGIC {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("pid {pid}: not a Weft shm hello")));
    }
    let arena_len = u64::from_le_bytes(hello[8..].try_into().expect("8 bytes"));
    if arena_len > server.arena_bytes_max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "pid {pid} (uid {}): an arena of {arena_len} bytes exceeds this server's shm_arena_bytes_max of {} bytes",
                peer_cred.uid, server.arena_bytes_max
            ),
        ));
    }
    let arena = match (fd, arena_len) {
        (None, 0) => None,
        (Some(fd), len) if len > 0 => {
            sys::check_arena_fd(&fd, len)?;
            Some(sys::SharedMap::map(&fd, len)?)
        }
        _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "arena length and descriptor disagree")),
    };
    if !sys::pidfd_alive(&pidfd)? {
        return Err(io::Error::other(format!("pid {pid} exited during the hello")));
    }
    let peer = format!("shm:pid{pid}");
    let memory = Arc::new(ShmPeer::new(pid, pidfd, arena));
    split(stream, peer, Some(memory), Some(peer_cred))
}

pub struct ShmListener {
    rx: mpsc::Receiver<io::Result<Connection<ShmFabric>>>,
    addr: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener<ShmFabric> for ShmListener {
    async fn accept(&mut self) -> io::Result<Connection<ShmFabric>> {
        self.rx.recv().await.unwrap_or_else(|| Err(io::Error::other("shm accept loop ended")))
    }

    fn local_addr(&self) -> io::Result<String> {
        Ok(self.addr.clone())
    }
}

/// The server's view of one client connection's memory.
struct ShmPeer {
    pid: i32,
    /// The client's process itself (not its number), held from the hello on.
    pidfd: OwnedFd,
    arena: Option<sys::SharedMap>,
    regions: ClientRegions,
}

impl ShmPeer {
    fn new(pid: i32, pidfd: OwnedFd, arena: Option<sys::SharedMap>) -> ShmPeer {
        // The arena is region 0 at offset 0 of its mapping; process-memory regions carry their own addresses.
        let arena_region = arena.as_ref().map(|a| Region { id: ARENA_REGION, addr: 0, len: a.len() as u64, rkey: 0 });
        ShmPeer { pid, pidfd, arena, regions: ClientRegions::new(arena_region) }
    }

    /// Fails unless the client's process is still alive, so `pid` still names it.
    ///
    /// process_vm_readv/writev take a pid number, not a pidfd, so a race remains: the client exits, is reaped
    /// and its number is given to a new process between this check and the system call. A read closes it by
    /// checking again after the call (if the client is alive afterwards, its number named it throughout; if not,
    /// the bytes are thrown away). A write cannot be undone; it is accepted because the window is a few
    /// microseconds in which the kernel would have to hand out every other pid number (allocation is cyclic up
    /// to pid_max, 4 Mi on 64-bit hosts) before reusing this one, the new process would need writable memory at
    /// the client's registered addresses, and process_vm_writev still demands ptrace rights over it. Besides, the
    /// client's death closes the socket, which revokes this memory as soon as the server notices.
    fn ensure_alive(&self) -> Result<(), MemoryError> {
        match sys::pidfd_alive(&self.pidfd) {
            Ok(true) => Ok(()),
            Ok(false) => Err(MemoryError::Io(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("the client process {} has exited", self.pid),
            ))),
            Err(e) => Err(MemoryError::Io(e)),
        }
    }

    /// Checks the list, then splits it into arena copies and process-memory vectors (in chunk order, paired
    /// with the byte range of the local buffer each covers).
    fn plan(&self, chunks: &[Chunk], want: u64) -> Result<Vec<(Chunk, Option<u64>, usize)>, MemoryError> {
        let mut at = 0usize;
        self.regions.resolve(chunks, want, |r, c| {
            let addr = (c.region != ARENA_REGION).then(|| r.addr + c.offset);
            at += c.len as usize;
            (*c, addr, at - c.len as usize)
        })
    }
}

impl PeerMemory for ShmPeer {
    fn revoke(&self) {
        self.regions.revoke();
    }

    fn register(&self, add: &[Region], remove: &[u32]) -> Result<(), ChunkError> {
        self.regions.register(add, remove)
    }

    fn check(&self, chunks: &[Chunk], want: u64) -> Result<(), ChunkError> {
        self.regions.check(chunks, want)
    }

    fn get(&self, chunks: &[Chunk], dst: &mut [u8]) -> Result<(), MemoryError> {
        let plan = self.plan(chunks, dst.len() as u64)?;
        let mut remote = Vec::new();
        let mut local_ranges = Vec::new();
        for (c, addr, at) in plan {
            let len = c.len as usize;
            match addr {
                None => self
                    .arena
                    .as_ref()
                    .expect("arena region implies an arena")
                    .copy_out(c.offset, &mut dst[at..at + len])?,
                Some(a) => {
                    remote.push(sys::RemoteVec { base: a as usize, len });
                    local_ranges.push(at..at + len);
                }
            }
        }
        if !remote.is_empty() {
            let mut local: Vec<IoSliceMut<'_>> = Vec::with_capacity(local_ranges.len());
            let mut rest: &mut [u8] = dst;
            let mut consumed = 0;
            for r in local_ranges {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(r.start - consumed);
                let (mine, tail) = tail.split_at_mut(r.end - r.start);
                local.push(IoSliceMut::new(mine));
                rest = tail;
                consumed = r.end;
            }
            self.ensure_alive()?;
            sys::vm_read(self.pid, &mut local, &remote)?;
            // Alive after the read: the pid named the client throughout, so the bytes are its own.
            self.ensure_alive()?;
        }
        Ok(())
    }

    fn put(&self, chunks: &[Chunk], src: &[u8]) -> Result<(), MemoryError> {
        let plan = self.plan(chunks, src.len() as u64)?;
        let mut remote = Vec::new();
        let mut local = Vec::new();
        for (c, addr, at) in plan {
            let len = c.len as usize;
            match addr {
                None => {
                    self.arena.as_ref().expect("arena region implies an arena").copy_in(c.offset, &src[at..at + len])?
                }
                Some(a) => {
                    remote.push(sys::RemoteVec { base: a as usize, len });
                    local.push(IoSlice::new(&src[at..at + len]));
                }
            }
        }
        if !remote.is_empty() {
            self.ensure_alive()?;
            sys::vm_write(self.pid, &local, &remote)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn arena_is_shared_and_chunks_are_checked() {
        let dir = std::env::temp_dir().join(format!("weft-shm-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let addr = format!("{SHM_SCHEME}{}", dir.join("s.sock").display());
        let server = ShmFabric::default();
        let mut l = server.listen(&addr).await.unwrap();
        let client = ShmFabric::new(ShmConfig { arena_buffers: 2, buffer_bytes: 8192 });
        let mut c = client.connect(&l.local_addr().unwrap()).await.unwrap();
        let mut s = l.accept().await.unwrap();
        let mem = s.memory.clone().expect("shm connections carry the peer's memory");
        assert_eq!(crate::peer::stats().arenas, 1);

        // Arena: the server puts, the client sees it.
        let arena = client.arena().unwrap();
        let mut b = arena.acquire(8192).await;
        mem.put(&[b.chunk(100, 5)], b"hello").unwrap();
        let mut got = [0u8; 5];
        b.copy_out(100, &mut got);
        assert_eq!(&got, b"hello");
        b.copy_in(0, b"world");
        let mut back = [0u8; 5];
        mem.get(&[b.chunk(0, 5)], &mut back).unwrap();
        assert_eq!(&back, b"world");

        // Process memory: registered regions only.
        let mut mine = vec![0u8; 4096];
        let region = Region { id: 7, addr: mine.as_ptr() as u64, len: 4096, rkey: 0 };
        let outside = Chunk { region: 7, offset: 4000, len: 200 };
        assert!(matches!(mem.put(&[outside], &[1u8; 200]), Err(MemoryError::Chunk(ChunkError::UnknownRegion { .. }))));
        mem.register(&[region], &[]).unwrap();
        assert!(matches!(mem.put(&[outside], &[1u8; 200]), Err(MemoryError::Chunk(ChunkError::OutOfRegion { .. }))));
        mem.put(&[Chunk { region: 7, offset: 10, len: 3 }], b"abc").unwrap();
        assert_eq!(&std::hint::black_box(&mut mine)[10..13], b"abc");

        // Messages still flow both ways; dropping the server side releases the arena.
        c.writer.write_all(b"ping").await.unwrap();
        let mut p = [0u8; 4];
        s.reader.read_exact(&mut p).await.unwrap();
        assert_eq!(&p, b"ping");
        drop(mem);
        drop(s);
        assert_eq!(crate::peer::stats().arenas, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn scratch_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-shm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Other users must be able to reach the socket's directory, so only the socket's own mode decides.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    fn mode_of(path: &std::path::Path) -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().mode() & 0o7777
    }

    #[tokio::test]
    async fn socket_is_0600_and_refuses_other_users() {
        let dir = scratch_dir("mode");
        let path = dir.join("s.sock");
        let _l = ShmFabric::default().listen(&format!("{SHM_SCHEME}{}", path.display())).await.unwrap();
        assert_eq!(mode_of(&path), 0o600);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no staging name left behind");
        if !nix::unistd::geteuid().is_root() {
            return; // dropping to another uid needs root; the mode above is what the kernel enforces
        }
        assert_eq!(sys::connect_as(&path, 0, 0).unwrap(), 0, "root (and the owner) may connect");
        assert_eq!(sys::connect_as(&path, 65533, 65533).unwrap(), libc::EACCES, "another user is refused");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn socket_group_may_connect_others_may_not() {
        let dir = scratch_dir("group");
        let path = dir.join("s.sock");
        let f = ShmFabric::default()
            .with_server(ShmServerConfig { socket_group: Some("65532".into()), ..ShmServerConfig::default() });
        let _l = f.listen(&format!("{SHM_SCHEME}{}", path.display())).await.unwrap();
        assert_eq!(mode_of(&path), 0o660);
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&path).unwrap().gid(), 65532);
        assert_eq!(sys::connect_as(&path, 65533, 65532).unwrap(), 0, "a member of the group connects");
        assert_eq!(sys::connect_as(&path, 65533, 65533).unwrap(), libc::EACCES, "a non-member is refused");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn an_arena_over_the_maximum_is_refused_with_a_clear_error() {
        let (client, server) = UnixStream::pair().unwrap();
        let arena = Arena::create(ShmConfig { arena_buffers: 4, buffer_bytes: 64 << 10 }).unwrap();
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(HELLO_MAGIC);
        hello[8..].copy_from_slice(&(arena.len() as u64).to_le_bytes());
        client.writable().await.unwrap();
        sys::send_hello(client.as_raw_fd(), &hello, Some(arena.fd.as_raw_fd())).unwrap();
        let cfg = ShmServerConfig { arena_bytes_max: 128 << 10, ..ShmServerConfig::default() };
        let e = handshake(server, &cfg).await.err().expect("refused");
        let msg = e.to_string();
        assert!(msg.contains("262144") && msg.contains("shm_arena_bytes_max of 131072"), "{msg}");

        // At the maximum it is accepted, and the connection carries the peer's credentials.
        let (client, server) = UnixStream::pair().unwrap();
        client.writable().await.unwrap();
        sys::send_hello(client.as_raw_fd(), &hello, Some(arena.fd.as_raw_fd())).unwrap();
        let cfg = ShmServerConfig { arena_bytes_max: 256 << 10, ..ShmServerConfig::default() };
        let c = handshake(server, &cfg).await.unwrap();
        let cred = c.peer_cred.expect("shm names its peer");
        assert_eq!((cred.uid, cred.pid), (nix::unistd::geteuid().as_raw(), std::process::id() as i32));
    }

    #[test]
    fn a_pidfd_of_an_exited_child_is_detected() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let fd = sys::pidfd_open(child.id() as i32).unwrap();
        assert!(sys::pidfd_alive(&fd).unwrap());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!sys::pidfd_alive(&fd).unwrap(), "a reaped child is gone even if its pid is reused");
        let peer = ShmPeer::new(child.id() as i32, fd, None);
        let mut buf = [0u8; 8];
        let mine = [0u8; 8];
        peer.register(&[Region { id: 3, addr: mine.as_ptr() as u64, len: 8, rkey: 0 }], &[]).unwrap();
        let e = peer.get(&[Chunk { region: 3, offset: 0, len: 8 }], &mut buf).unwrap_err();
        assert!(e.to_string().contains("has exited"), "{e}");
    }
}
