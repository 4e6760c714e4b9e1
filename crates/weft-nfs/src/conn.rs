//! Deadlines of one NFS connection over TCP, shared by the gateway's listener and the pNFS data servers'
//! (issue 31): a peer may sit idle between records for `idle_ms`, must finish a record it began within
//! `frame_ms`, and must read a reply within `send_ms`. A peer that breaks one is cut off, so a connection that
//! opens and never sends, sends half a record, or never reads its replies holds its connection permit for a
//! bounded time, as the RPC server's connections do (weft-rpc's conn.rs).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Mutex;

use crate::rpc::{self, RecordError, RecordLimits};

/// The deadlines of a connection, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnDeadlines {
    /// Between records (knfsd closes a TCP connection idle for 6 minutes; a client reconnects on its next call).
    pub idle_ms: u64,
    /// From a record's first byte to its last.
    pub frame_ms: u64,
    /// For a reply to be taken by the peer (written into the socket).
    pub send_ms: u64,
}

impl Default for ConnDeadlines {
    fn default() -> Self {
        ConnDeadlines { idle_ms: 360_000, frame_ms: 30_000, send_ms: 30_000 }
    }
}

/// What waiting for the next record gave.
#[derive(Debug)]
pub enum NextRecord {
    Record(Vec<u8>),
    /// The peer closed the connection between records.
    Closed,
    /// Nothing arrived within `idle_ms`.
    Idle,
    /// A record began but did not end within `frame_ms`.
    Stalled,
    Broken(RecordError),
}

/// Waits for the next whole record under `d`'s idle and frame deadlines.
pub async fn next_record(rd: &mut OwnedReadHalf, limits: &RecordLimits, d: &ConnDeadlines) -> NextRecord {
    let mut first = [0u8; 1];
    match tokio::time::timeout(Duration::from_millis(d.idle_ms), rd.peek(&mut first)).await {
        Err(_) => return NextRecord::Idle,
        Ok(Ok(0)) => return NextRecord::Closed,
        Ok(Err(e)) => return NextRecord::Broken(RecordError::Io(e)),
        Ok(Ok(_)) => {}
    }
    match tokio::time::timeout(Duration::from_millis(d.frame_ms), rpc::read_record(rd, limits)).await {
        Err(_) => NextRecord::Stalled,
        Ok(Ok(Some(r))) => NextRecord::Record(r),
        Ok(Ok(None)) => NextRecord::Closed,
        Ok(Err(e)) => NextRecord::Broken(e),
    }
}

/// Writes `reply` unless the peer does not take it within `send_ms` (waiting for the connection's writer
/// included); `false` when it was not sent whole, and then the connection must be closed (a reply cut short
/// leaves the record stream unreadable).
pub async fn send_reply(wr: &Arc<Mutex<OwnedWriteHalf>>, reply: &rpc::Reply, d: &ConnDeadlines) -> bool {
    let send = async { rpc::write_reply(&mut *wr.lock().await, reply).await };
    matches!(tokio::time::timeout(Duration::from_millis(d.send_ms), send).await, Ok(Ok(())))
}
