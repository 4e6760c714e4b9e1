//! The `tcp` backend: always present, two-sided only. Bulk data follows the message header in the same stream and
//! is written with vectored I/O straight from the caller's buffers. With a [`TlsConfig`] every connection runs
//! under TLS 1.3 ([`crate::tls`]): the client handshakes in `connect`, the listener handshakes accepted sockets
//! in the background (bounded, each with a deadline) so a slow or hostile peer never holds up `accept`.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinSet};
use tracing::warn;

use crate::tls::{TlsConfig, server_name};
use crate::{Capabilities, Connection, Fabric, Killer, Listener};

/// A server's whole TLS handshake must finish within this; a peer that stalls is dropped.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Accepted sockets whose TLS handshake is still running; at the cap the oldest is dropped for the newest (a
/// well-behaved client finishes in a few round trips, so the oldest is the likeliest staller).
pub const TLS_HANDSHAKES_PENDING_MAX: usize = 256;

#[derive(Debug, Clone, Default)]
pub struct TcpFabric {
    /// SO_SNDBUF/SO_RCVBUF in bytes; `None` keeps the kernel's autotuning.
    pub socket_buffer_bytes: Option<usize>,
    /// Run every connection under TLS (`tls = true`); `None` is plain TCP.
    pub tls: Option<TlsConfig>,
}

/// A duplicate of the socket's descriptor: `shutdown(2)` on it ends the connection for both halves.
pub struct TcpKiller(OwnedFd);

impl Killer for TcpKiller {
    fn kill(&self) {
        // The socket may already be shut down or reset; either way it is dead afterwards.
        let _ = socket2::SockRef::from(&self.0).shutdown(std::net::Shutdown::Both);
    }
}

type TlsStream = tokio_rustls::TlsStream<TcpStream>;

/// The read half of a tcp connection, plain or under TLS.
pub enum TcpReader {
    Plain(OwnedReadHalf),
    Tls(ReadHalf<TlsStream>),
}

/// The write half of a tcp connection, plain or under TLS.
pub enum TcpWriter {
    Plain(OwnedWriteHalf),
    Tls(WriteHalf<TlsStream>),
}

impl AsyncRead for TcpReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            TcpReader::Plain(r) => Pin::new(r).poll_read(cx, buf),
            TcpReader::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for TcpWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            TcpWriter::Plain(w) => Pin::new(w).poll_write(cx, buf),
            TcpWriter::Tls(w) => Pin::new(w).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            TcpWriter::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            // rustls takes the slices into TLS records (the encryption is the copy) and writes them out.
            TcpWriter::Tls(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            TcpWriter::Plain(w) => Pin::new(w).poll_flush(cx),
            TcpWriter::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            TcpWriter::Plain(w) => Pin::new(w).poll_shutdown(cx),
            TcpWriter::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

impl TcpFabric {
    /// The same fabric with every connection under TLS.
    pub fn with_tls(mut self, tls: Option<TlsConfig>) -> TcpFabric {
        self.tls = tls;
        self
    }

    fn prepare(&self, stream: &TcpStream) -> io::Result<TcpKiller> {
        stream.set_nodelay(true)?;
        if let Some(n) = self.socket_buffer_bytes {
            let s = socket2::SockRef::from(stream);
            s.set_send_buffer_size(n)?;
            s.set_recv_buffer_size(n)?;
        }
        Ok(TcpKiller(stream.as_fd().try_clone_to_owned()?))
    }

    fn wrap(&self, stream: TcpStream, peer: String) -> io::Result<Connection<Self>> {
        let killer = self.prepare(&stream)?;
        let (reader, writer) = stream.into_split();
        let (reader, writer) = (TcpReader::Plain(reader), TcpWriter::Plain(writer));
        Ok(Connection { reader, writer, killer, peer, memory: None, channel_binding: None })
    }

    fn wrap_tls(killer: TcpKiller, stream: TlsStream, binding: [u8; 32], peer: String) -> Connection<Self> {
        let (reader, writer) = tokio::io::split(stream);
        let (reader, writer) = (TcpReader::Tls(reader), TcpWriter::Tls(writer));
        Connection { reader, writer, killer, peer, memory: None, channel_binding: Some(binding) }
    }
}

/// RFC 9266's `tls-exporter` channel binding of a finished TLS 1.3 handshake: 32 bytes of the exporter with label
/// `EXPORTER-Channel-Binding` and no context.
fn channel_binding<D>(conn: &rustls::ConnectionCommon<D>) -> io::Result<[u8; 32]> {
    conn.export_keying_material([0u8; 32], b"EXPORTER-Channel-Binding", None)
        .map_err(|e| io::Error::other(format!("TLS exporter: {e}")))
}

/// A TLS handshake failure, said so that the operator knows what to check.
fn handshake_error(side: &str, peer: &str, e: io::Error) -> io::Error {
    let hint = if side == "client" {
        "is tls on at the server, and does its certificate chain to our tls_ca_file and name this address?"
    } else {
        "a plaintext client (tls off on its side), or one that does not trust our certificate"
    };
    io::Error::new(e.kind(), format!("TLS handshake with {peer} failed: {e} ({hint})"))
}

impl Fabric for TcpFabric {
    type Reader = TcpReader;
    type Writer = TcpWriter;
    type Killer = TcpKiller;
    type Listener = TcpFabricListener;

    fn capabilities(&self) -> Capabilities {
        Capabilities { name: if self.tls.is_some() { "tls" } else { "tcp" }, one_sided: false, pins_pages: false }
    }

    async fn connect(&self, addr: &str) -> io::Result<Connection<Self>> {
        let stream = TcpStream::connect(addr).await?;
        let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| addr.to_string());
        let Some(tls) = &self.tls else { return self.wrap(stream, peer) };
        let killer = self.prepare(&stream)?;
        let name = server_name(addr)?;
        let stream = tls.connector().connect(name, stream).await.map_err(|e| handshake_error("client", addr, e))?;
        let binding = channel_binding(stream.get_ref().1)?;
        Ok(Self::wrap_tls(killer, stream.into(), binding, peer))
    }

    async fn listen(&self, addr: &str) -> io::Result<TcpFabricListener> {
        let acceptor = self.tls.as_ref().map(|t| t.acceptor()).transpose()?;
        Ok(TcpFabricListener {
            listener: TcpListener::bind(addr).await?,
            fabric: self.clone(),
            acceptor,
            handshakes: JoinSet::new(),
            pending: VecDeque::new(),
        })
    }
}

pub struct TcpFabricListener {
    listener: TcpListener,
    fabric: TcpFabric,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    /// TLS handshakes under way, and their abort handles oldest first (to drop the oldest at the cap).
    handshakes: JoinSet<Option<Connection<TcpFabric>>>,
    pending: VecDeque<AbortHandle>,
}

impl TcpFabricListener {
    fn start_handshake(&mut self, acceptor: tokio_rustls::TlsAcceptor, stream: TcpStream, peer: String) {
        let killer = match self.fabric.prepare(&stream) {
            Ok(k) => k,
            Err(e) => {
                warn!(%peer, "dropping an accepted connection: {e}");
                return;
            }
        };
        self.pending.retain(|h| !h.is_finished());
        if self.pending.len() >= TLS_HANDSHAKES_PENDING_MAX
            && let Some(oldest) = self.pending.pop_front()
        {
            warn!(pending = TLS_HANDSHAKES_PENDING_MAX, "too many TLS handshakes under way, dropping the oldest");
            oldest.abort();
        }
        let handle = self.handshakes.spawn(async move {
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(s)) => match channel_binding(s.get_ref().1) {
                    Ok(binding) => Some(TcpFabric::wrap_tls(killer, s.into(), binding, peer)),
                    Err(e) => {
                        warn!(%peer, "refusing a connection: {e}");
                        None
                    }
                },
                Ok(Err(e)) => {
                    warn!(%peer, "refusing a connection: {}", handshake_error("server", &peer, e));
                    None
                }
                Err(_) => {
                    warn!(%peer, timeout_ms = TLS_HANDSHAKE_TIMEOUT.as_millis() as u64, "TLS handshake not completed in time, closing connection");
                    None
                }
            }
        });
        self.pending.push_back(handle);
    }
}

impl Listener<TcpFabric> for TcpFabricListener {
    async fn accept(&mut self) -> io::Result<Connection<TcpFabric>> {
        let Some(acceptor) = self.acceptor.clone() else {
            let (stream, peer) = self.listener.accept().await?;
            return self.fabric.wrap(stream, peer.to_string());
        };
        // Both branches are cancel-safe: a connection accepted or a handshake finished is never lost.
        loop {
            tokio::select! {
                accepted = self.listener.accept() => {
                    let (stream, peer) = accepted?;
                    self.start_handshake(acceptor.clone(), stream, peer.to_string());
                }
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(conn)) = done {
                        return Ok(conn);
                    }
                }
            }
        }
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
