//! One fabric type over all backends, chosen per address: `unix:/path` connects with [`ShmFabric`],
//! `rdma:host:port` with the rdma fabric (feature `rdma`), anything else (`host:port`) with [`TcpFabric`]. Lets a
//! client talk `shm` to the data servers on its own host and `rdma` or `tcp` to the others through one
//! `RpcClient` type.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

#[cfg(feature = "rdma")]
use crate::rdma::{RdmaFabric, RdmaListener};
use crate::shm::{SHM_SCHEME, ShmFabric, ShmListener};
use crate::tcp::{TcpFabric, TcpFabricListener};
use crate::{Arena, Capabilities, Connection, Fabric, Killer, Listener, LocalRegistration};

#[derive(Clone)]
pub struct AnyFabric {
    pub tcp: TcpFabric,
    pub shm: ShmFabric,
    /// Shares the shm fabric's arena: one client, one arena, whichever fabric reaches it.
    #[cfg(feature = "rdma")]
    pub rdma: RdmaFabric,
}

impl AnyFabric {
    pub fn new(tcp: TcpFabric, shm: ShmFabric) -> AnyFabric {
        AnyFabric {
            tcp,
            #[cfg(feature = "rdma")]
            rdma: RdmaFabric::new(shm.clone()),
            shm,
        }
    }
}

impl AnyFabric {
    /// Authenticates every `rdma` side channel with `auth` before any queue pair is made (no-op without rdma).
    pub fn with_side_channel_auth(mut self, auth: Option<Arc<dyn crate::SideChannelAuth>>) -> AnyFabric {
        #[cfg(feature = "rdma")]
        {
            self.rdma = self.rdma.with_side_channel_auth(auth);
        }
        #[cfg(not(feature = "rdma"))]
        let _ = auth;
        self
    }

    /// Bounds the `rdma` listeners' handshakes: at most `handshakes_max` at once, each within
    /// `handshake_timeout_ms` (no-op without rdma).
    pub fn with_rdma_handshake_limits(mut self, handshakes_max: u32, handshake_timeout_ms: u64) -> AnyFabric {
        #[cfg(feature = "rdma")]
        {
            self.rdma = self.rdma.with_limits(crate::rdma::RdmaServerLimits { handshakes_max, handshake_timeout_ms });
        }
        #[cfg(not(feature = "rdma"))]
        let _ = (handshakes_max, handshake_timeout_ms);
        self
    }
}

impl Default for AnyFabric {
    fn default() -> Self {
        AnyFabric::new(TcpFabric::default(), ShmFabric::default())
    }
}

/// Address prefix of the rdma fabric (`weft_fabric::rdma::RDMA_SCHEME`; spelt here so builds without the feature
/// still recognise, and refuse, such addresses).
const RDMA_PREFIX: &str = "rdma:";

/// Which backend an address names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tcp,
    Shm,
    Rdma,
}

fn kind(addr: &str) -> Kind {
    if addr.starts_with(SHM_SCHEME) {
        Kind::Shm
    } else if addr.starts_with(RDMA_PREFIX) {
        Kind::Rdma
    } else {
        Kind::Tcp
    }
}

#[cfg(not(feature = "rdma"))]
fn no_rdma() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "this build has no rdma fabric (cargo feature `rdma` is off)")
}

macro_rules! any_enum {
    ($name:ident, $assoc:ident) => {
        pub enum $name {
            Tcp(<TcpFabric as Fabric>::$assoc),
            Shm(<ShmFabric as Fabric>::$assoc),
            #[cfg(feature = "rdma")]
            Rdma(<RdmaFabric as Fabric>::$assoc),
        }
    };
}
any_enum!(AnyReader, Reader);
any_enum!(AnyWriter, Writer);
any_enum!(AnyKiller, Killer);

pub enum AnyListener {
    Tcp(TcpFabricListener),
    Shm(ShmListener),
    #[cfg(feature = "rdma")]
    Rdma(RdmaListener),
}

/// Runs `$body` with `$x` bound to the inner value of whichever variant `$e` is.
macro_rules! each {
    ($e:expr, $t:ident, $x:ident => $body:expr) => {
        match $e {
            $t::Tcp($x) => $body,
            $t::Shm($x) => $body,
            #[cfg(feature = "rdma")]
            $t::Rdma($x) => $body,
        }
    };
}

impl AsyncRead for AnyReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        each!(self.get_mut(), AnyReader, r => Pin::new(r).poll_read(cx, buf))
    }
}

impl AsyncWrite for AnyWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        each!(self.get_mut(), AnyWriter, w => Pin::new(w).poll_write(cx, buf))
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self.get_mut(), AnyWriter, w => Pin::new(w).poll_write_vectored(cx, bufs))
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self.get_mut(), AnyWriter, w => Pin::new(w).poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self.get_mut(), AnyWriter, w => Pin::new(w).poll_shutdown(cx))
    }
}

impl Killer for AnyKiller {
    fn kill(&self) {
        each!(self, AnyKiller, k => k.kill())
    }
}

macro_rules! wrap {
    ($variant:ident, $c:expr) => {{
        let c = $c;
        Connection {
            reader: AnyReader::$variant(c.reader),
            writer: AnyWriter::$variant(c.writer),
            killer: AnyKiller::$variant(c.killer),
            peer: c.peer,
            memory: c.memory,
            peer_cred: c.peer_cred,
            channel_binding: c.channel_binding,
        }
    }};
}

impl Fabric for AnyFabric {
    type Reader = AnyReader;
    type Writer = AnyWriter;
    type Killer = AnyKiller;
    type Listener = AnyListener;

    fn capabilities(&self) -> Capabilities {
        Capabilities { name: "any", one_sided: false, pins_pages: false }
    }

    fn capabilities_of(&self, addr: &str) -> Capabilities {
        match kind(addr) {
            Kind::Shm => self.shm.capabilities(),
            #[cfg(feature = "rdma")]
            Kind::Rdma => self.rdma.capabilities(),
            _ => self.tcp.capabilities(),
        }
    }

    fn arena(&self) -> Option<Arc<Arena>> {
        self.shm.arena()
    }

    fn register_local(&self, peer: &str, addr: u64, len: u64) -> io::Result<Option<LocalRegistration>> {
        match kind(peer) {
            #[cfg(feature = "rdma")]
            Kind::Rdma => self.rdma.register_local(peer, addr, len),
            _ => Ok(None),
        }
    }

    async fn connect(&self, addr: &str) -> io::Result<Connection<Self>> {
        match kind(addr) {
            Kind::Shm => Ok(wrap!(Shm, self.shm.connect(addr).await?)),
            #[cfg(feature = "rdma")]
            Kind::Rdma => Ok(wrap!(Rdma, self.rdma.connect(addr).await?)),
            #[cfg(not(feature = "rdma"))]
            Kind::Rdma => Err(no_rdma()),
            Kind::Tcp => Ok(wrap!(Tcp, self.tcp.connect(addr).await?)),
        }
    }

    async fn listen(&self, addr: &str) -> io::Result<AnyListener> {
        match kind(addr) {
            Kind::Shm => self.shm.listen(addr).await.map(AnyListener::Shm),
            #[cfg(feature = "rdma")]
            Kind::Rdma => self.rdma.listen(addr).await.map(AnyListener::Rdma),
            #[cfg(not(feature = "rdma"))]
            Kind::Rdma => Err(no_rdma()),
            Kind::Tcp => self.tcp.listen(addr).await.map(AnyListener::Tcp),
        }
    }
}

impl Listener<AnyFabric> for AnyListener {
    async fn accept(&mut self) -> io::Result<Connection<AnyFabric>> {
        match self {
            AnyListener::Tcp(l) => Ok(wrap!(Tcp, l.accept().await?)),
            AnyListener::Shm(l) => Ok(wrap!(Shm, l.accept().await?)),
            #[cfg(feature = "rdma")]
            AnyListener::Rdma(l) => Ok(wrap!(Rdma, l.accept().await?)),
        }
    }

    fn local_addr(&self) -> io::Result<String> {
        each!(self, AnyListener, l => l.local_addr())
    }
}
