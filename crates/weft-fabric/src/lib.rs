//! Endpoints: how two Weft processes reach each other.
//!
//! A [`Fabric`] opens connections and listens; each connection is a reader, a writer and a [`Killer`] that can
//! tear the connection down from any task (so a timed-out caller never waits on a blocked reader). The RPC layer
//! (`weft-rpc`) is generic over the fabric and never names TCP. Backends advertise [`Capabilities`] so the RPC layer
//! can pick the data path: `tcp` offers only two-sided messages, bulk data rides in the stream; one-sided backends
//! (`shm`, `rdma`) are later issues.

use std::future::Future;
use std::io;

use tokio::io::{AsyncRead, AsyncWrite};

#[cfg(feature = "rdma")]
pub mod rdma;
pub mod tcp;

pub use tcp::TcpFabric;

/// What a fabric can do; the RPC layer chooses transfer methods from this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub name: &'static str,
    /// The peer's registered memory can be read and written without its CPU (RDMA READ/WRITE, shared memory).
    pub one_sided: bool,
}

/// Tears a connection down; pending reads and writes on both halves fail promptly.
pub trait Killer: Send + Sync + 'static {
    fn kill(&self);
}

pub struct Connection<F: Fabric> {
    pub reader: F::Reader,
    pub writer: F::Writer,
    pub killer: F::Killer,
    /// The peer's address, for logs.
    pub peer: String,
}

pub trait Fabric: Clone + Send + Sync + 'static {
    type Reader: AsyncRead + Unpin + Send + 'static;
    type Writer: AsyncWrite + Unpin + Send + 'static;
    type Killer: Killer;
    type Listener: Listener<Self>;

    fn capabilities(&self) -> Capabilities;
    fn connect(&self, addr: &str) -> impl Future<Output = io::Result<Connection<Self>>> + Send;
    fn listen(&self, addr: &str) -> impl Future<Output = io::Result<Self::Listener>> + Send;
}

pub trait Listener<F: Fabric>: Send + 'static {
    fn accept(&mut self) -> impl Future<Output = io::Result<Connection<F>>> + Send;
    /// The bound address, e.g. after listening on port 0.
    fn local_addr(&self) -> io::Result<String>;
}
