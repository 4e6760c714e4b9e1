//! A PostgreSQL connection's socket, driven by the thread that waits for its reply: no runtime and no thread of
//! the store's own, so a round trip costs no thread hand-off (two wake-ups per round trip before, measured as a
//! sixth of a service's CPU under a stat storm, docs/bench.md).
//!
//! tokio-postgres splits a connection into a `Client`, whose request futures talk to the `Connection` through
//! channels, and the `Connection`, a future that does the socket's I/O. [`Driven::drive`] polls a request future
//! and the connection in turn on the calling thread; the socket never blocks ([`Nonblocking`]), and when neither
//! can go on the thread waits for the socket with poll(2). An idle connection is polled by nobody: what the
//! server sends meanwhile waits in the socket's buffer for the connection's next use.

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::{Host, TargetSessionAttrs};
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{Client, Config, Connection, NoTls, SimpleQueryMessage};

use crate::error::MetaError;

/// How long a TCP connect may take when the connection string names no `connect_timeout`.
const CONNECT_TIMEOUT_DEFAULT_MS: u64 = 10_000;

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// A nonblocking socket whose reads and writes that would block return `Pending` without keeping the waker:
/// only [`Driven::drive`] polls it, and it waits for the socket itself. A write that would block is noted, so
/// that the wait includes the socket's room to write.
struct Nonblocking {
    stream: Stream,
    write_blocked: Arc<AtomicBool>,
}

impl Nonblocking {
    fn io<T>(r: io::Result<T>) -> Poll<io::Result<T>> {
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
            r => Poll::Ready(r),
        }
    }
}

impl AsyncRead for Nonblocking {
    fn poll_read(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let dst = buf.initialize_unfilled();
        let r = loop {
            let r = match &mut this.stream {
                Stream::Tcp(s) => s.read(dst),
                Stream::Unix(s) => s.read(dst),
            };
            if !matches!(&r, Err(e) if e.kind() == io::ErrorKind::Interrupted) {
                break r;
            }
        };
        Nonblocking::io(r).map_ok(|n| buf.advance(n))
    }
}

impl AsyncWrite for Nonblocking {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = match &mut this.stream {
            Stream::Tcp(s) => s.write(data),
            Stream::Unix(s) => s.write(data),
        };
        let polled = Nonblocking::io(r);
        if polled.is_pending() {
            this.write_blocked.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = match &self.get_mut().stream {
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Write),
        };
        Poll::Ready(r)
    }
}

/// Notes that a future asked to be polled again.
#[derive(Default)]
struct Woken(AtomicBool);

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The socket side of one connection.
pub(super) struct Driven {
    /// `None` once it ended (the server closed it, or it broke): dropping it fails every request still waiting.
    connection: Option<Pin<Box<Connection<Nonblocking, NoTlsStream>>>>,
    /// A duplicate of the socket's descriptor, to wait on (the connection owns the socket).
    fd: OwnedFd,
    write_blocked: Arc<AtomicBool>,
}

impl Driven {
    /// Whether the connection's socket side ended.
    pub(super) fn ended(&self) -> bool {
        self.connection.is_none()
    }

    /// Polls `fut` to completion on this thread, with the connection doing the socket's I/O in between.
    pub(super) fn drive<F: Future>(&mut self, fut: F) -> F::Output {
        let mut fut = pin!(fut);
        let woken = Arc::new(Woken::default());
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        loop {
            woken.0.store(false, Ordering::Relaxed);
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            let Some(connection) = self.connection.as_mut() else {
                // The requests of an ended connection fail at once (their channels are closed).
                assert!(woken.0.load(Ordering::Relaxed), "a request waits on a connection that ended");
                continue;
            };
            self.write_blocked.store(false, Ordering::Relaxed);
            if let Poll::Ready(end) = connection.as_mut().poll(&mut cx) {
                if let Err(e) = end {
                    tracing::warn!("PostgreSQL connection ended: {}", super::describe(&e));
                }
                self.connection = None;
                continue;
            }
            if !woken.0.load(Ordering::Relaxed) {
                wait(&self.fd, self.write_blocked.load(Ordering::Relaxed));
            }
        }
    }

    /// Sends what requests are queued, without waiting for any reply (their replies are read at the next
    /// [`Driven::drive`]).
    pub(super) fn send_queued(&mut self) {
        let Some(connection) = self.connection.as_mut() else { return };
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(end) = connection.as_mut().poll(&mut cx) {
            if let Err(e) = end {
                tracing::warn!("PostgreSQL connection ended: {}", super::describe(&e));
            }
            self.connection = None;
        }
    }
}

/// Waits until the socket has something to read (or, when a write would have blocked, room to write), or was
/// closed; the connection's next poll finds out which. An interrupted wait only returns early.
fn wait(fd: &OwnedFd, write_blocked: bool) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let events = if write_blocked { PollFlags::POLLIN | PollFlags::POLLOUT } else { PollFlags::POLLIN };
    let _ = poll(&mut [PollFd::new(fd.as_fd(), events)], PollTimeout::NONE);
}

/// Connects as tokio-postgres's own `connect` does: each host of the connection string in order (TCP or a Unix
/// socket directory), the first that accepts the session and has the wanted `target_session_attrs`.
pub(super) fn connect(cfg: &Config) -> Result<(Client, Driven), MetaError> {
    let addrs: Vec<Host> = if cfg.get_hostaddrs().is_empty() {
        cfg.get_hosts().to_vec()
    } else {
        cfg.get_hostaddrs().iter().map(|a| Host::Tcp(a.to_string())).collect()
    };
    if addrs.is_empty() {
        return Err(MetaError::Store("the PostgreSQL connection string names no host".into()));
    }
    let ports = cfg.get_ports();
    let mut last = String::new();
    for (i, host) in addrs.iter().enumerate() {
        let port = ports.get(i).or_else(|| ports.first()).copied().unwrap_or(5432);
        match connect_host(cfg, host, port) {
            Ok(c) => return Ok(c),
            Err(e) => last = format!("{}: {e}", shown(host, port)),
        }
    }
    Err(MetaError::Store(format!("connecting to PostgreSQL: {last}")))
}

fn shown(host: &Host, port: u16) -> String {
    match host {
        Host::Tcp(h) => format!("{h}:{port}"),
        Host::Unix(dir) => format!("{}/.s.PGSQL.{port}", dir.display()),
    }
}

fn open(cfg: &Config, host: &Host, port: u16) -> io::Result<Stream> {
    match host {
        Host::Unix(dir) => Ok(Stream::Unix(UnixStream::connect(dir.join(format!(".s.PGSQL.{port}")))?)),
        Host::Tcp(name) => {
            let timeout =
                cfg.get_connect_timeout().copied().unwrap_or(Duration::from_millis(CONNECT_TIMEOUT_DEFAULT_MS));
            let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{name} resolves to no address"));
            for addr in (name.as_str(), port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&addr, timeout) {
                    Ok(s) => {
                        s.set_nodelay(true)?;
                        return Ok(Stream::Tcp(s));
                    }
                    Err(e) => last = e,
                }
            }
            Err(last)
        }
    }
}

fn connect_host(cfg: &Config, host: &Host, port: u16) -> Result<(Client, Driven), String> {
    let stream = open(cfg, host, port).map_err(|e| e.to_string())?;
    let fd = match &stream {
        Stream::Tcp(s) => s.set_nonblocking(true).and_then(|()| s.as_fd().try_clone_to_owned()),
        Stream::Unix(s) => s.set_nonblocking(true).and_then(|()| s.as_fd().try_clone_to_owned()),
    };
    let fd = fd.map_err(|e| e.to_string())?;
    let write_blocked = Arc::new(AtomicBool::new(false));
    let socket = Nonblocking { stream, write_blocked: write_blocked.clone() };
    // The handshake does its own I/O on the socket: driven with no connection yet.
    let mut driven = Driven { connection: None, fd, write_blocked };
    let (client, connection) = handshake(&mut driven, cfg.connect_raw(socket, NoTls))?;
    driven.connection = Some(Box::pin(connection));
    let wanted = cfg.get_target_session_attrs();
    if wanted != TargetSessionAttrs::Any {
        let read_only = read_only(&client, &mut driven).map_err(|e| super::describe(&e))?;
        if read_only != (wanted == TargetSessionAttrs::ReadOnly) {
            return Err(format!("the server's transaction_read_only is {read_only}, not as target_session_attrs asks"));
        }
    }
    Ok((client, driven))
}

/// Polls the handshake, waiting on the socket between polls.
fn handshake<T>(driven: &mut Driven, fut: impl Future<Output = Result<T, tokio_postgres::Error>>) -> Result<T, String> {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        driven.write_blocked.store(false, Ordering::Relaxed);
        if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
            return r.map_err(|e| super::describe(&e));
        }
        wait(&driven.fd, driven.write_blocked.load(Ordering::Relaxed));
    }
}

fn read_only(client: &Client, driven: &mut Driven) -> Result<bool, tokio_postgres::Error> {
    let messages = driven.drive(client.simple_query("SHOW transaction_read_only"))?;
    Ok(messages.iter().any(|m| matches!(m, SimpleQueryMessage::Row(r) if r.get(0) == Some("on"))))
}
