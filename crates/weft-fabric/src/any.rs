//! One fabric type over all backends, chosen per address: `unix:/path` connects with [`ShmFabric`], anything else
//! (`host:port`) with [`TcpFabric`]. Lets a client talk `shm` to the data servers on its own host and `tcp` to the
//! others through one `RpcClient` type.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::shm::{SHM_SCHEME, ShmFabric, ShmListener};
use crate::tcp::{TcpFabric, TcpFabricListener};
use crate::{Arena, Capabilities, Connection, Fabric, Killer, Listener};

#[derive(Clone, Default)]
pub struct AnyFabric {
    pub tcp: TcpFabric,
    pub shm: ShmFabric,
}

pub enum AnyReader {
    Tcp(<TcpFabric as Fabric>::Reader),
    Shm(<ShmFabric as Fabric>::Reader),
}
pub enum AnyWriter {
    Tcp(<TcpFabric as Fabric>::Writer),
    Shm(<ShmFabric as Fabric>::Writer),
}
pub enum AnyKiller {
    Tcp(<TcpFabric as Fabric>::Killer),
    Shm(<ShmFabric as Fabric>::Killer),
}
pub enum AnyListener {
    Tcp(TcpFabricListener),
    Shm(ShmListener),
}

impl AsyncRead for AnyReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AnyReader::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            AnyReader::Shm(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for AnyWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            AnyWriter::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            AnyWriter::Shm(w) => Pin::new(w).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            AnyWriter::Tcp(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            AnyWriter::Shm(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AnyWriter::Tcp(w) => Pin::new(w).poll_flush(cx),
            AnyWriter::Shm(w) => Pin::new(w).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AnyWriter::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            AnyWriter::Shm(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

impl Killer for AnyKiller {
    fn kill(&self) {
        match self {
            AnyKiller::Tcp(k) => k.kill(),
            AnyKiller::Shm(k) => k.kill(),
        }
    }
}

fn wrap_tcp(c: Connection<TcpFabric>) -> Connection<AnyFabric> {
    Connection {
        reader: AnyReader::Tcp(c.reader),
        writer: AnyWriter::Tcp(c.writer),
        killer: AnyKiller::Tcp(c.killer),
        peer: c.peer,
        memory: c.memory,
    }
}

fn wrap_shm(c: Connection<ShmFabric>) -> Connection<AnyFabric> {
    Connection {
        reader: AnyReader::Shm(c.reader),
        writer: AnyWriter::Shm(c.writer),
        killer: AnyKiller::Shm(c.killer),
        peer: c.peer,
        memory: c.memory,
    }
}

fn is_shm(addr: &str) -> bool {
    addr.starts_with(SHM_SCHEME)
}

impl Fabric for AnyFabric {
    type Reader = AnyReader;
    type Writer = AnyWriter;
    type Killer = AnyKiller;
    type Listener = AnyListener;

    fn capabilities(&self) -> Capabilities {
        Capabilities { name: "any", one_sided: false }
    }

    fn capabilities_of(&self, addr: &str) -> Capabilities {
        if is_shm(addr) { self.shm.capabilities() } else { self.tcp.capabilities() }
    }

    fn arena(&self) -> Option<Arc<Arena>> {
        self.shm.arena()
    }

    async fn connect(&self, addr: &str) -> io::Result<Connection<Self>> {
        if is_shm(addr) {
            self.shm.connect(addr).await.map(wrap_shm)
        } else {
            self.tcp.connect(addr).await.map(wrap_tcp)
        }
    }

    async fn listen(&self, addr: &str) -> io::Result<AnyListener> {
        if is_shm(addr) {
            self.shm.listen(addr).await.map(AnyListener::Shm)
        } else {
            self.tcp.listen(addr).await.map(AnyListener::Tcp)
        }
    }
}

impl Listener<AnyFabric> for AnyListener {
    async fn accept(&mut self) -> io::Result<Connection<AnyFabric>> {
        match self {
            AnyListener::Tcp(l) => l.accept().await.map(wrap_tcp),
            AnyListener::Shm(l) => l.accept().await.map(wrap_shm),
        }
    }

    fn local_addr(&self) -> io::Result<String> {
        match self {
            AnyListener::Tcp(l) => l.local_addr(),
            AnyListener::Shm(l) => l.local_addr(),
        }
    }
}
