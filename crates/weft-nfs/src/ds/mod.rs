//! The pNFS data server (docs/format.md §23): every Weft data server can also answer NFSv4.1 for the objects it
//! stores, so a pNFS client given a file layout by the gateway (the metadata server) reads and writes the data
//! servers directly and in parallel.
//!
//! - [`fh`]: the data-server filehandle, a §10 capability sealed by the MDS for key id `"pnfs"` plus the stripe
//!   geometry that maps the client's file offsets to this server's object offsets.
//! - [`compound`]: one COMPOUND of the few ops a data server answers, on the same objects, checksums and
//!   capability gate as Weft's own data path; sessions and the slot reply cache are the gateway's code
//!   ([`crate::nfs4::state`], shared steps in [`crate::nfs4::compound`] and [`crate::nfs4::session_ops`]).
//! - [`DsNfs::handle`] takes one RPC record and answers the reply: what any transport calls; [`DsNfs::serve`] is the
//!   TCP loop around it, and with `nfs_rdma_listen` set the RPC-over-RDMA transport ([`crate::rdma::transport`])
//!   calls it too. Over RDMA a READ is read into a buffer of the server's pool (a registered zone, checksums
//!   verified there) and RDMA WRITTEN from it, and a WRITE is stored from the registered buffer its read chunk
//!   was RDMA READ into: no staging copy either way.
//!
//! Bounded: `nfs_connections_max` connections, 64 requests in flight per connection (the session's slots),
//! records as the gateway's [`RecordLimits`], `nfs_clients_max` clients and `nfs_sessions_max` sessions.

pub mod compound;
pub mod fh;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use weft_data::capabilities::CapabilityGate;
use weft_data::{NfsParts, ObjectStore};
use weft_rpc::{KeyPolicy, Principal};

use crate::nfs4;
use crate::nfs4::state::StateConfig;
use crate::proto::{NFS_PROGRAM, NFS_V4};
use crate::rpc::{self, RecordLimits};

/// `EXCHGID4_FLAG_USE_PNFS_DS` (RFC 8881 §18.35.3).
pub const EXCHGID4_FLAG_USE_PNFS_DS: u32 = 0x0004_0000;
/// Requests of one connection served at once (the most slots a session gets, so a client filling its slots is
/// never held back; more wait, which is the back-pressure).
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;
/// Inodes named in a connection's closing log line at most (the count of bytes covers all).
const INOS_LOGGED_MAX: usize = 16;

/// Bytes one connection moved, for its closing log line (the pNFS VM test reads it).
#[derive(Default)]
pub struct ConnStats {
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    inos: Mutex<BTreeSet<u64>>,
    inos_more: AtomicU64,
    /// READ data goes into a buffer of the server's pool (a registered zone) rather than a page-cache mapping:
    /// set for RPC-over-RDMA connections, whose transport RDMA WRITEs straight from the zone.
    pub(crate) into_zone: bool,
}

impl ConnStats {
    /// A connection's counters; `into_zone` as the field.
    pub fn new(into_zone: bool) -> ConnStats {
        ConnStats { into_zone, ..ConnStats::default() }
    }

    pub fn touched(&self, ino: u64) {
        let mut s = self.inos.lock().expect("inodes");
        if s.len() < INOS_LOGGED_MAX || s.contains(&ino) {
            s.insert(ino);
        } else {
            self.inos_more.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn log_close(&self, peer: SocketAddr) {
        let (r, w) = (self.read_bytes.load(Ordering::Relaxed), self.write_bytes.load(Ordering::Relaxed));
        let inos = self.inos.lock().expect("inodes").iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        if r > 0 || w > 0 {
            let more = self.inos_more.load(Ordering::Relaxed);
            tracing::info!(%peer, "pnfs ds: served READ {r} bytes, WRITE {w} bytes for ino {inos}{}",
                if more > 0 { " and others" } else { "" });
        }
    }
}

/// A data server's NFSv4.1 side.
pub struct DsNfs {
    pub(crate) store: Arc<ObjectStore>,
    /// `None` with authentication off: handles are not checked.
    pub(crate) gate: Option<Arc<CapabilityGate>>,
    /// The data server's lease (stale-layout fencing): a fenced server serves pNFS no more than Weft's clients.
    pub(crate) lease: Arc<weft_data::lease::LeaseGate>,
    pub(crate) nfs4: nfs4::Server,
    /// WRITE and COMMIT's verifier: new at every start, so clients resend what they did not commit.
    pub(crate) verifier: [u8; 8],
    /// Who a handle's capability must have been sealed for (rule 7 of §10 becomes "key id pnfs").
    pub(crate) principal: Principal,
    /// The server's buffer zones, which READs over RPC-over-RDMA read into.
    pub(crate) pool: weft_rpc::BufferPool,
    record: RecordLimits,
    /// Idle, frame and send deadlines of every connection (the gateway's defaults).
    deadlines: crate::conn::ConnDeadlines,
    connections: Arc<Semaphore>,
}

#[cfg(feature = "rdma")]
impl crate::rdma::transport::RecordHandler for DsNfs {
    type Conn = ConnStats;
    fn open(&self, _peer: SocketAddr) -> ConnStats {
        ConnStats::new(true)
    }
    fn handle<'a>(
        &'a self,
        rec: &'a Bytes,
        peer: SocketAddr,
        conn: &'a ConnStats,
    ) -> impl std::future::Future<Output = Option<rpc::Reply>> + 'a {
        DsNfs::handle(self, rec, peer, conn)
    }
    fn close(&self, peer: SocketAddr, conn: ConnStats) {
        conn.log_close(peer);
    }
}

impl DsNfs {
    pub fn new(parts: &NfsParts) -> DsNfs {
        let mut rand = [0u8; 12];
        // Randomness for the verifier and the epoch; a failure of the system RNG is not survivable anyway.
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut rand).expect("system randomness");
        let verifier: [u8; 8] = rand[..8].try_into().expect("8 bytes");
        let epoch = u32::from_be_bytes(rand[8..].try_into().expect("4 bytes")) | 1;
        let cfg = StateConfig {
            clients_max: parts.cfg.nfs_clients_max.max(1) as usize,
            sessions_max: parts.cfg.nfs_sessions_max.max(1) as usize,
            ..StateConfig::default()
        };
        DsNfs {
            store: parts.store.clone(),
            gate: parts.gate.clone(),
            lease: parts.lease.clone(),
            nfs4: nfs4::Server::data_server(cfg, epoch, parts.cfg.id),
            verifier,
            principal: Principal::Key {
                key_id: weft_proto::msg::PNFS_KEY_ID.into(),
                policy: KeyPolicy::Fixed { uid: crate::NOBODY, gid: crate::NOBODY },
            },
            pool: parts.pool.clone(),
            record: RecordLimits::default(),
            deadlines: crate::conn::ConnDeadlines::default(),
            connections: Arc::new(Semaphore::new(parts.cfg.nfs_connections_max.max(1) as usize)),
        }
    }

    /// Answers one RPC record (a whole call, record marking removed): the reply to send, or `None` when nothing
    /// is to be sent (a call too broken to answer). Callable from any transport.
    pub async fn handle(&self, rec: &Bytes, peer: SocketAddr, stats: &ConnStats) -> Option<rpc::Reply> {
        let call = match rpc::parse_call(rec) {
            Ok(c) => c,
            Err(e) => {
                tracing::info!(%peer, error = %e, "pnfs ds: refused a call");
                return e.reply().map(Into::into);
            }
        };
        Some(match (call.prog, call.vers) {
            (NFS_PROGRAM, NFS_V4) => compound::call(self, &call, rec, peer, stats).await,
            (NFS_PROGRAM, _) => {
                let mut w = rpc::accepted(call.xid, rpc::PROG_MISMATCH);
                w.u32(NFS_V4).u32(NFS_V4);
                w.buf.into()
            }
            _ => rpc::accepted(call.xid, rpc::PROG_UNAVAIL).buf.into(),
        })
    }

    /// Serves `listener` until the task is dropped; connections past `nfs_connections_max` are closed at accept.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "pnfs ds: accept failed");
                    continue;
                }
            };
            let Ok(permit) = self.connections.clone().try_acquire_owned() else {
                tracing::warn!(%peer, "pnfs ds: too many connections (nfs_connections_max), closing this one");
                continue;
            };
            let ds = self.clone();
            tokio::spawn(async move {
                ds.connection(stream, peer).await;
                drop(permit);
            });
        }
    }

    async fn connection(self: Arc<Self>, stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        tracing::debug!(%peer, "pnfs ds: connection");
        let (mut rd, wr) = stream.into_split();
        let wr = Arc::new(tokio::sync::Mutex::new(wr));
        let inflight = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX));
        let stats = Arc::new(ConnStats::default());
        let d = self.deadlines;
        let dead = Arc::new(tokio::sync::Notify::new());
        loop {
            use crate::conn::NextRecord;
            let next = tokio::select! {
                n = crate::conn::next_record(&mut rd, &self.record, &d) => n,
                () = dead.notified() => NextRecord::Stalled,
            };
            let rec = match next {
                NextRecord::Record(r) => Bytes::from(r),
                NextRecord::Closed | NextRecord::Idle => break,
                NextRecord::Broken(rpc::RecordError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                NextRecord::Stalled => {
                    tracing::info!(%peer, "pnfs ds: closing the connection: a record or a reply stalled past its deadline");
                    break;
                }
                NextRecord::Broken(e) => {
                    tracing::warn!(%peer, error = %e, "pnfs ds: closing the connection");
                    break;
                }
            };
            let permit = inflight.clone().acquire_owned().await.expect("never closed");
            let (ds, wr, stats, dead) = (self.clone(), wr.clone(), stats.clone(), dead.clone());
            tokio::spawn(async move {
                if let Some(reply) = ds.handle(&rec, peer, &stats).await
                    && !crate::conn::send_reply(&wr, &reply, &d).await
                {
                    dead.notify_one();
                }
                drop(permit);
            });
        }
        // Requests still running hold permits: wait for them so the byte counts are whole.
        let _all = inflight.acquire_many(REQUESTS_IN_FLIGHT_MAX as u32).await;
        stats.log_close(peer);
    }
}

/// Binds every `nfs_listen` address and serves each in a task, and `nfs_rdma_listen` on a thread of its own;
/// answers the addresses bound.
pub async fn start(parts: NfsParts) -> std::io::Result<weft_data::NfsBound> {
    let ds = Arc::new(DsNfs::new(&parts));
    let mut bound = weft_data::NfsBound::default();
    for at in &parts.cfg.nfs_listen {
        let l = TcpListener::bind(at).await.map_err(|e| std::io::Error::new(e.kind(), format!("{at}: {e}")))?;
        bound.tcp.push(l.local_addr()?);
        tokio::spawn(ds.clone().serve(l));
    }
    if let Some(at) = &parts.cfg.nfs_rdma_listen {
        bound.rdma = Some(start_rdma(&ds, &parts, at)?);
    }
    Ok(bound)
}

#[cfg(feature = "rdma")]
fn start_rdma(ds: &Arc<DsNfs>, parts: &NfsParts, at: &str) -> std::io::Result<SocketAddr> {
    use std::io::{Error, ErrorKind};
    let listen: SocketAddr = at
        .parse()
        .map_err(|_| Error::new(ErrorKind::InvalidInput, format!("nfs_rdma_listen {at:?} is not ip:port")))?;
    if listen.port() == 0 || listen.ip().is_unspecified() {
        // RDMA CM binds no ephemeral port it could tell, and clients need the one device address to connect to.
        return Err(Error::new(ErrorKind::InvalidInput, format!("nfs_rdma_listen {at}: name an address and a port")));
    }
    let cfg = crate::rdma::transport::RdmaConfig {
        listen,
        connections_max: parts.cfg.nfs_connections_max.max(1) as usize,
        ..Default::default()
    };
    crate::rdma::transport::serve(ds.clone(), cfg, tokio::runtime::Handle::current())
        .map_err(|e| Error::other(format!("nfs_rdma_listen {at}: {e}")))?;
    Ok(listen)
}

#[cfg(not(feature = "rdma"))]
fn start_rdma(_ds: &Arc<DsNfs>, _parts: &NfsParts, at: &str) -> std::io::Result<SocketAddr> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, format!("nfs_rdma_listen {at}: built without rdma")))
}

/// What `weft data` hands [`weft_data::run_with_nfs`].
pub fn starter() -> weft_data::NfsStarter {
    Box::new(|parts| Box::pin(start(parts)))
}
