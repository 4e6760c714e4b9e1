//! The RPC byte stream of an `rdma` connection, carried by two-sided messages on a queue pair of its own.
//!
//! One pump thread per connection owns the message [`Endpoint`] (evented: it sleeps on the completion channel)
//! and moves bytes between it and two bounded queues: what the writer hands in goes out as messages of at most
//! the peer's receive size, under the peer's credits; arriving messages are queued for the reader. When the
//! reader's queue is full the pump stops taking messages, their receives stay un-posted and the peer runs out of
//! credits: back-pressure reaches the sender without anything growing.
//!
//! The TCP side channel the queue pairs were set up over stays open as the connection's liveness signal: a peer
//! that exits or is killed closes it, the pump sees end-of-file and ends the stream (an RC queue pair with no
//! traffic would not notice). [`StreamKiller`] shuts it down, so both ends stop promptly.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Endpoint;
use crate::Killer;

/// Bytes queued per direction (written but not yet sent; received but not yet read).
const QUEUE_BYTES_MAX: usize = 1 << 20;
/// Longest sleep of an idle pump between checks of its stream's state (it is woken sooner by any event).
const IDLE_WAIT_MS: u64 = 1000;
/// Idle waits an orderly close grants the bytes still queued (the peer may have stopped granting credits).
const CLOSE_WAITS_MAX: u32 = 5;

#[derive(Default)]
struct State {
    out: VecDeque<Bytes>,
    out_bytes: usize,
    /// A writer waiting for queue space or for a flush.
    out_waker: Option<Waker>,
    inq: VecDeque<Bytes>,
    in_bytes: usize,
    in_waker: Option<Waker>,
    /// The pump stopped taking messages because `inq` is full; the reader wakes it after making room.
    pump_wants_space: bool,
    /// Reader and writer halves still alive; at 0 the stream closes.
    handles: u8,
    /// No more reads or writes; the pump still sends what was written before (an orderly close)…
    closed: bool,
    /// …unless the stream was killed or failed: then it stops at once.
    killed: bool,
    /// Why the pump ended, if not by an orderly close.
    error: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    /// Writing a byte here wakes the pump.
    wake: UnixStream,
}

impl Shared {
    fn wake_pump(&self) {
        // A full socket buffer already holds a wake-up, so a failed write loses nothing.
        let _ = (&self.wake).write(&[1]);
    }

    fn close(&self, kill: bool, error: Option<String>) {
        let (r, w) = {
            let mut s = self.state.lock().expect("rdma stream");
            s.closed = true;
            s.killed |= kill;
            if s.error.is_none() {
                s.error = error;
            }
            (s.in_waker.take(), s.out_waker.take())
        };
        r.into_iter().chain(w).for_each(Waker::wake);
        self.wake_pump();
    }
}

/// Starts the pump of a connection: `ep` carries the messages, `side` is the side channel (liveness).
pub(super) fn start(
    ep: Endpoint,
    side: TcpStream,
    name: String,
) -> io::Result<(StreamReader, StreamWriter, StreamKiller)> {
    let (wake, wake_rx) = UnixStream::pair()?;
    wake.set_nonblocking(true)?;
    wake_rx.set_nonblocking(true)?;
    side.set_nonblocking(true)?;
    let side_fd: OwnedFd = side.try_clone()?.into();
    let shared = Arc::new(Shared { state: Mutex::new(State { handles: 2, ..State::default() }), wake });
    let pump_shared = shared.clone();
    std::thread::Builder::new().name("weft-rdma-pump".into()).spawn(move || {
        let r = pump(ep, &side, &wake_rx, &pump_shared);
        if let Err(e) = &r {
            tracing::debug!(peer = %name, "rdma stream ended: {e}");
        }
        pump_shared.close(true, r.err().map(|e| e.to_string()));
        // The side channel closes here (after the queue pair is gone), telling the peer.
        drop(side);
    })?;
    Ok((
        StreamReader { shared: shared.clone() },
        StreamWriter { shared: shared.clone() },
        StreamKiller { shared, side: side_fd },
    ))
}

fn pump(mut ep: Endpoint, side: &TcpStream, wake_rx: &UnixStream, shared: &Shared) -> io::Result<()> {
    let io = |e: super::RdmaError| io::Error::other(e.to_string());
    let max = ep.payload_bytes_max();
    // Idle waits since an orderly close: what is still queued gets this long to leave.
    let mut closing_waits = 0u32;
    loop {
        let mut progress = false;
        // Outgoing: as many messages as credits allow.
        loop {
            let mut s = shared.state.lock().expect("rdma stream");
            if s.killed || (s.closed && (s.out.is_empty() || closing_waits >= CLOSE_WAITS_MAX)) {
                return Ok(());
            }
            let Some(front) = s.out.front_mut() else { break };
            let n = front.len().min(max);
            if !ep.try_send(&front[..n]).map_err(io)? {
                break;
            }
            let _ = front.split_to(n);
            if front.is_empty() {
                s.out.pop_front();
            }
            s.out_bytes -= n;
            progress = true;
            if let Some(w) = s.out_waker.take() {
                drop(s);
                w.wake();
            }
        }
        // Incoming: while the reader's queue has room.
        loop {
            {
                let mut s = shared.state.lock().expect("rdma stream");
                if s.in_bytes >= QUEUE_BYTES_MAX {
                    s.pump_wants_space = true;
                    break;
                }
            }
            let Some(msg) = ep.try_recv(Bytes::copy_from_slice).map_err(io)? else { break };
            let mut s = shared.state.lock().expect("rdma stream");
            s.in_bytes += msg.len();
            s.inq.push_back(msg);
            progress = true;
            if let Some(w) = s.in_waker.take() {
                drop(s);
                w.wake();
            }
        }
        if progress {
            continue;
        }
        if shared.state.lock().expect("rdma stream").closed {
            closing_waits += 1;
        }
        let ready =
            ep.wait_event(&[wake_rx.as_raw_fd(), side.as_raw_fd()], Duration::from_millis(IDLE_WAIT_MS)).map_err(io)?;
        if ready[0] {
            let mut sink = [0u8; 64];
            while matches!((&*wake_rx).read(&mut sink), Ok(n) if n > 0) {}
        }
        if ready[1] {
            let mut byte = [0u8; 1];
            match (&*side).read(&mut byte) {
                Ok(0) => return Ok(()), // the peer closed the connection
                Ok(_) => return Err(io::Error::new(io::ErrorKind::InvalidData, "bytes on the rdma side channel")),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

fn closed_error(s: &State) -> io::Error {
    match &s.error {
        Some(e) => io::Error::new(io::ErrorKind::ConnectionReset, e.clone()),
        None => io::Error::new(io::ErrorKind::BrokenPipe, "the rdma connection is closed"),
    }
}

fn drop_handle(shared: &Shared) {
    let last = {
        let mut s = shared.state.lock().expect("rdma stream");
        s.handles = s.handles.saturating_sub(1);
        s.handles == 0
    };
    if last {
        shared.close(false, None);
    }
}

pub struct StreamReader {
    shared: Arc<Shared>,
}

impl AsyncRead for StreamReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let shared = &self.shared;
        let mut s = shared.state.lock().expect("rdma stream");
        if s.inq.is_empty() {
            if s.closed {
                // End of stream after an orderly close; a failed pump is an error.
                return Poll::Ready(if s.error.is_some() { Err(closed_error(&s)) } else { Ok(()) });
            }
            s.in_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        while buf.remaining() > 0 {
            let Some(front) = s.inq.front_mut() else { break };
            let n = front.len().min(buf.remaining());
            buf.put_slice(&front.split_to(n));
            if front.is_empty() {
                s.inq.pop_front();
            }
            s.in_bytes -= n;
        }
        let wake = s.pump_wants_space && s.in_bytes < QUEUE_BYTES_MAX / 2;
        if wake {
            s.pump_wants_space = false;
        }
        drop(s);
        if wake {
            shared.wake_pump();
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for StreamReader {
    fn drop(&mut self) {
        drop_handle(&self.shared);
    }
}

pub struct StreamWriter {
    shared: Arc<Shared>,
}

impl StreamWriter {
    fn queue(&self, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let mut s = self.shared.state.lock().expect("rdma stream");
        if s.closed {
            return Poll::Ready(Err(closed_error(&s)));
        }
        let room = QUEUE_BYTES_MAX.saturating_sub(s.out_bytes);
        if room == 0 {
            s.out_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut chunk = BytesMut::with_capacity(total.min(room));
        for b in bufs {
            let n = b.len().min(room - chunk.len());
            chunk.extend_from_slice(&b[..n]);
            if chunk.len() == room {
                break;
            }
        }
        let n = chunk.len();
        if n > 0 {
            s.out_bytes += n;
            s.out.push_back(chunk.freeze());
        }
        drop(s);
        self.shared.wake_pump();
        Poll::Ready(Ok(n))
    }
}

impl AsyncWrite for StreamWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.queue(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.queue(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Done once the pump has handed every queued byte to the queue pair.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut s = self.shared.state.lock().expect("rdma stream");
        if s.out_bytes == 0 {
            return Poll::Ready(Ok(()));
        }
        if s.closed {
            return Poll::Ready(Err(closed_error(&s)));
        }
        s.out_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        drop_handle(&self.shared);
    }
}

/// Ends the stream from any task: both halves fail (or see end of stream) at once, and the side channel is shut
/// down so the peer's pump stops too.
pub struct StreamKiller {
    shared: Arc<Shared>,
    side: OwnedFd,
}

impl StreamKiller {
    /// A second handle on the same connection (for the server's memory, which ends it when a transfer fails).
    pub(super) fn try_clone(&self) -> io::Result<StreamKiller> {
        Ok(StreamKiller { shared: self.shared.clone(), side: self.side.try_clone()? })
    }
}

impl Killer for StreamKiller {
    fn kill(&self) {
        // Already shut down or reset: dead either way.
        let _ = socket2::SockRef::from(&self.side).shutdown(std::net::Shutdown::Both);
        self.shared.close(true, None);
    }
}
