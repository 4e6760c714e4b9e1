//! The `tcp` backend: always present, two-sided only. Bulk data follows the message header in the same stream and
//! is written with vectored I/O straight from the caller's buffers.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use crate::{Capabilities, Connection, Fabric, Killer, Listener};

#[derive(Debug, Clone, Default)]
pub struct TcpFabric {
    /// SO_SNDBUF/SO_RCVBUF in bytes; `None` keeps the kernel's autotuning.
    pub socket_buffer_bytes: Option<usize>,
}

/// A duplicate of the socket's descriptor: `shutdown(2)` on it ends the connection for both halves.
pub struct TcpKiller(OwnedFd);

impl Killer for TcpKiller {
    fn kill(&self) {
        // The socket may already be shut down or reset; either way it is dead afterwards.
        let _ = socket2::SockRef::from(&self.0).shutdown(std::net::Shutdown::Both);
    }
}

impl TcpFabric {
    fn wrap(&self, stream: TcpStream, peer: String) -> io::Result<Connection<Self>> {
        stream.set_nodelay(true)?;
        if let Some(n) = self.socket_buffer_bytes {
            let s = socket2::SockRef::from(&stream);
            s.set_send_buffer_size(n)?;
            s.set_recv_buffer_size(n)?;
        }
        let killer = TcpKiller(stream.as_fd().try_clone_to_owned()?);
        let (reader, writer) = stream.into_split();
        Ok(Connection { reader, writer, killer, peer, memory: None, peer_cred: None })
    }
}

impl Fabric for TcpFabric {
    type Reader = OwnedReadHalf;
    type Writer = OwnedWriteHalf;
    type Killer = TcpKiller;
    type Listener = TcpFabricListener;

    fn capabilities(&self) -> Capabilities {
        Capabilities { name: "tcp", one_sided: false, pins_pages: false }
    }

    async fn connect(&self, addr: &str) -> io::Result<Connection<Self>> {
        let stream = TcpStream::connect(addr).await?;
        let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| addr.to_string());
        self.wrap(stream, peer)
    }

    async fn listen(&self, addr: &str) -> io::Result<TcpFabricListener> {
        Ok(TcpFabricListener { listener: TcpListener::bind(addr).await?, fabric: self.clone() })
    }
}

pub struct TcpFabricListener {
    listener: TcpListener,
    fabric: TcpFabric,
}

impl Listener<TcpFabric> for TcpFabricListener {
    async fn accept(&mut self) -> io::Result<Connection<TcpFabric>> {
        let (stream, peer) = self.listener.accept().await?;
        self.fabric.wrap(stream, peer.to_string())
    }

    fn local_addr(&self) -> io::Result<String> {
        Ok(self.listener.local_addr()?.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn connect_send_and_kill() {
        let f = TcpFabric::default();
        let mut l = f.listen("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let client = tokio::spawn({
            let f = f.clone();
            async move { f.connect(&addr).await.unwrap() }
        });
        let mut server = l.accept().await.unwrap();
        let mut c = client.await.unwrap();
        c.writer.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        server.reader.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        // Killing the client's connection ends a read blocked on it, on this side and the peer's.
        let blocked = tokio::spawn(async move { c.reader.read(&mut [0u8; 8]).await });
        c.killer.kill();
        assert_eq!(blocked.await.unwrap().unwrap(), 0);
        assert_eq!(server.reader.read(&mut buf).await.unwrap(), 0);
    }
}
