//! Authentication of a fabric's own side channel (the TCP connection an `rdma` connection starts with), before any
//! queue pair or memory registration is made for the peer. The fabric knows no keys: whoever builds it (weft-rpc,
//! with the cluster key's HMAC scheme) supplies a [`SideChannelAuth`]; docs/format.md §4 has the exchange.

use std::future::Future;
use std::io;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};

/// A byte stream a side-channel exchange runs over (the TCP side channel; a duplex pipe in tests).
pub trait SideStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> SideStream for T {}

/// What an authentication exchange returns: done, or why not (the fabric logs it and closes the side channel).
pub type SideAuthFuture<'a> = Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>>;

/// Proves this side's key and checks the peer's over a side channel. Both methods read and write only what
/// their exchange needs, so the fabric's own protocol follows on the same stream.
pub trait SideChannelAuth: Send + Sync + 'static {
    /// The connecting side's half.
    fn client<'a>(&'a self, stream: &'a mut dyn SideStream) -> SideAuthFuture<'a>;
    /// The accepting side's half; `peer` names the peer in logs.
    fn server<'a>(&'a self, stream: &'a mut dyn SideStream, peer: &'a str) -> SideAuthFuture<'a>;
}
