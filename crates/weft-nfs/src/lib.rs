//! `weft nfs`: a gateway that exports a Weft cluster (or a subtree) to unmodified NFS clients.
//!
//! One TCP port serves ONC RPC (RFC 5531, [`rpc`]) with a dispatcher by (program, version): MOUNT v3 and NFSv3
//! (RFC 1813, [`mount`], [`nfs3`]) and NFSv4.1 (RFC 8881, [`nfs4`]); other NFS versions answer PROG_MISMATCH (3–4).
//! Requests run through [`weft_client`] acting as the caller's AUTH_SYS identity (root squashed per export), so
//! the gateway gets striping and the fabrics for free and the MDS applies its permission checks to that
//! identity; the gateway's own key must be the cluster key or a client key of policy `trusted` (docs/format.md
//! §9). Filehandles are sealed ([`fh`], docs/format.md §15). Everything is bounded: connections, requests in
//! flight per connection, record size, open files ([`files`]), read-ahead ([`readahead`]), directory cursors.
//!
//! Restarts: with a state directory the gateway records its MDS session ([`restart`]), and the next process
//! adopts that session's locks at start, holding them through the NFSv4 grace period for their clients to
//! reclaim; what nobody reclaimed is unlocked when grace ends (docs/format.md §22).

pub mod conn;
pub mod ds;
pub mod fh;
pub mod files;
pub mod mount;
pub mod nfs3;
pub mod nfs4;
pub mod proto;
pub mod rdma;
pub mod readahead;
pub mod restart;
pub mod rpc;
pub mod status;
pub mod xdr;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use weft_client::{Client, ClientError, ClusterConfig};
use weft_proto::UserCred;
use weft_proto::msg::SetLockReq;

use crate::fh::FhSealer;
use crate::files::OpenFiles;
use crate::proto::{MOUNT_PROGRAM, MOUNT_V3, NFS_PROGRAM, NFS_V3, NFS_V4};
use crate::restart::{OwnerKey, StateDir};
use crate::rpc::{Auth, Call, RecordLimits};

/// The transport a call record arrived on ([`Gateway::handle_record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// ONC RPC record marking over TCP (RFC 5531 §11).
    Tcp,
    /// RPC-over-RDMA version 1 (RFC 8166).
    Rdma,
}

/// The uid and gid root and AUTH_NONE callers become.
pub const NOBODY: u32 = 65534;

/// An address range callers may come from (`127.0.0.1/32`, `10.0.0.0/8`, `::1/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub net: IpAddr,
    pub prefix_len: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Cidr, String> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let net: IpAddr = addr.parse().map_err(|_| format!("{s:?}: not an IP address"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix_len = match len {
            Some(l) => l.parse::<u8>().ok().filter(|&l| l <= max).ok_or(format!("{s:?}: prefix length 0–{max}"))?,
            None => max,
        };
        Ok(Cidr { net, prefix_len })
    }
}

impl Cidr {
    /// Whether every address of the network is a loopback address (127.0.0.0/8 or ::1).
    pub fn is_loopback(&self) -> bool {
        match self.net.to_canonical() {
            IpAddr::V4(v4) => self.prefix_len >= 8 && v4.is_loopback(),
            IpAddr::V6(v6) => self.prefix_len == 128 && v6.is_loopback(),
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let bits = |a: IpAddr| -> u128 {
            match a {
                IpAddr::V4(v) => u32::from(v) as u128,
                IpAddr::V6(v) => u128::from(v),
            }
        };
        if ip.is_ipv4() != self.net.is_ipv4() {
            return false;
        }
        let width = if ip.is_ipv4() { 32 } else { 128 };
        let shift = width - self.prefix_len as u32;
        if shift >= 128 {
            return true;
        }
        (bits(ip) >> shift) == (bits(self.net) >> shift)
    }
}

/// Parses `--allow` (comma-separated CIDRs).
pub fn parse_allow(s: &str) -> Result<Vec<Cidr>, String> {
    s.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::parse).collect()
}

/// Whether the gateway is a pNFS metadata server (NFSv4.1 file layouts, docs/format.md §24).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PnfsMode {
    /// Never: NFSv4.1 clients move every byte through the gateway.
    Off,
    /// Always (a file whose data servers have no NFS address is still served through the gateway).
    On,
    /// On if a data server advertised NFS addresses to the MDS when the gateway started, else off.
    #[default]
    Auto,
}

impl std::str::FromStr for PnfsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<PnfsMode, String> {
        match s {
            "off" => Ok(PnfsMode::Off),
            "on" => Ok(PnfsMode::On),
            "auto" => Ok(PnfsMode::Auto),
            _ => Err(format!("{s:?}: one of on, off, auto")),
        }
    }
}

/// Inodes whose data bytes the gateway counts ([`Gateway::data_bytes`]); past it the oldest is forgotten.
pub const DATA_BYTES_INODES_MAX: usize = 4096;

/// Connections from addresses outside `--allow` open at once (each answered a few records, then closed); more are
/// closed at accept. They never take one of `connections_max`'s permits.
pub const REFUSED_CONNECTIONS_MAX: usize = 16;
/// Records a connection from outside `--allow` is answered (NULL probes, refusals) before it is closed.
pub const REFUSED_RECORDS_MAX: usize = 8;
/// Source ports below this are privileged: only root binds them (`--secure`).
pub const PRIVILEGED_PORT_END: u16 = 1024;

/// READ and WRITE data bytes the gateway itself moved, per inode (bounded, oldest forgotten first): with pNFS a
/// file with a layout out should see none, and the VM test checks that.
#[derive(Default)]
struct DataBytes {
    map: HashMap<u64, (u64, u64)>,
    order: VecDeque<u64>,
}

/// How the gateway serves.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The Weft directory exported (`/` the whole namespace).
    pub export: String,
    /// Client addresses served; others get MNT3ERR_ACCES and AUTH_ERROR.
    pub allow: Vec<Cidr>,
    /// uid/gid 0 (and group 0) become [`NOBODY`].
    pub root_squash: bool,
    /// Connections served at once; more wait in the listen backlog (back-pressure).
    pub connections_max: usize,
    /// Requests of one connection run at once; the connection is not read further until one finishes.
    pub requests_in_flight_max: usize,
    /// Open weft files cached ([`files`]).
    pub open_files_max: usize,
    /// A cached open file unused this long is synced and closed.
    pub open_idle_ms: u64,
    /// Files (per user) a sequential reader's next ranges are read ahead for ([`readahead`]); 0: no read-ahead.
    pub read_ahead_files_max: usize,
    /// Ranges (each one READ's size, at most 1 MiB) read ahead per file.
    pub read_ahead_depth: usize,
    /// Directory cursors (READDIR cookie → name) remembered.
    pub dir_cursors_max: usize,
    pub record: RecordLimits,
    /// NFSv4.1: lease and grace times, table bounds ([`nfs4::state::StateConfig`]).
    pub nfs4: nfs4::state::StateConfig,
    /// Where the gateway records its MDS session, so its next process adopts its locks ([`restart`]); `None`:
    /// nothing kept, a restarted gateway's clients find their locks held until the MDS releases them.
    pub state_dir: Option<PathBuf>,
    /// pNFS metadata server: off, on, or on when data servers advertise NFS addresses (`--pnfs`).
    pub pnfs: PnfsMode,
    /// pNFS: every this many ms, each file with layouts out is checked for changes made elsewhere (a shrink,
    /// mode/owner/group, layout generation, removal) and its layouts recalled on one; 0: never.
    pub layout_check_ms: u64,
    /// Idle, frame and send deadlines of every TCP connection ([`conn`]).
    pub deadlines: conn::ConnDeadlines,
    /// knfsd's `secure`: AUTH_SYS calls over TCP only from privileged source ports (below 1024), which only root
    /// may bind, so an unprivileged process on an allowed host cannot assert another uid. `weft nfs` turns it on
    /// when `--allow` names any address outside loopback.
    pub secure: bool,
    /// The gateway holds metadata leases (docs/format.md §31): GETATTR, LOOKUP and the attributes every reply
    /// carries come from its lease cache while the MDS holds the leases, instead of a round trip each. Off: every
    /// one asks the MDS (or the cache bank).
    pub metadata_leases: bool,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            export: "/".into(),
            allow: vec![Cidr { net: IpAddr::from([127, 0, 0, 1]), prefix_len: 8 }, "::1/128".parse().expect("cidr")],
            root_squash: true,
            connections_max: 256,
            requests_in_flight_max: 32,
            open_files_max: 1024,
            open_idle_ms: 5_000,
            read_ahead_files_max: 16,
            read_ahead_depth: 2,
            dir_cursors_max: 4096,
            record: RecordLimits::default(),
            nfs4: nfs4::state::StateConfig::default(),
            state_dir: None,
            pnfs: PnfsMode::Auto,
            layout_check_ms: 3_000,
            deadlines: conn::ConnDeadlines::default(),
            secure: false,
            metadata_leases: true,
        }
    }
}

/// Why a gateway cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    #[error("connecting to the cluster: {0}")]
    Client(#[from] ClientError),
    #[error("export {path}: {error}")]
    Export { path: String, error: String },
    #[error("{0}")]
    Key(String),
    #[error("state directory: {0}")]
    StateDir(String),
}

/// One running gateway.
pub struct Gateway {
    client: Client,
    cfg: GatewayConfig,
    sealer: FhSealer,
    export_ino: u64,
    fsid: u64,
    files: OpenFiles,
    cursors: Mutex<Cursors>,
    nfs4: nfs4::Server,
    /// The state directory, held while this gateway runs, and the MDS session last recorded in it.
    state_dir: Option<StateDir>,
    recorded_session: AtomicU64,
    /// pNFS layouts are served (`--pnfs`, resolved at start).
    pnfs: bool,
    data_bytes: Mutex<DataBytes>,
    /// This gateway, for the tasks it spawns (recalls).
    me: Weak<Gateway>,
    /// The next callback's xid.
    cb_xid: AtomicU32,
    /// The next connection's number (back channels name their connection by it).
    conn_ids: AtomicU64,
}

/// READDIR cookie → the name it continues after, bounded (oldest dropped first); a miss rescans the directory.
#[derive(Default)]
struct Cursors {
    map: HashMap<(u64, u64), String>,
    order: VecDeque<(u64, u64)>,
}

impl Gateway {
    /// Connects to the cluster and resolves the export.
    pub async fn new(cluster: &ClusterConfig, cfg: GatewayConfig) -> Result<Arc<Gateway>, GatewayError> {
        let key = match cluster.credential().map_err(GatewayError::Key)? {
            Some(c) => c.key,
            None => {
                tracing::warn!(
                    "authentication is off: filehandles are sealed with a fixed key, so clients can forge them"
                );
                weft_rpc::Key::from_bytes([0; 32])
            }
        };
        // Held before anything else: a second gateway on the same directory would take this one's locks.
        let state_dir = cfg.state_dir.as_deref().map(StateDir::open).transpose().map_err(GatewayError::StateDir)?;
        let client = Client::connect(cluster).await?;
        if cfg.metadata_leases {
            // The MDS says on the channel whether it grants any (services that share PostgreSQL grant none yet).
            client.hold_leases();
        }
        let export = normalize_export(&cfg.export)?;
        let root = client
            .resolve(&export)
            .await
            .map_err(|e| GatewayError::Export { path: export.clone(), error: e.to_string() })?;
        if root.kind != weft_proto::FileKind::Dir {
            return Err(GatewayError::Export { path: export, error: "not a directory".into() });
        }
        let sealer = FhSealer::new(&key, &export);
        let verifier = (weft_rpc::auth::random_id()
            ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
            ^ ((std::process::id() as u64) << 40))
            .to_be_bytes();
        let fsid = sealer.export_id() as u64;
        let files = OpenFiles::new(
            u64::from_be_bytes(verifier),
            cfg.open_files_max,
            cfg.open_idle_ms,
            cfg.read_ahead_files_max,
            cfg.read_ahead_depth,
        );
        // The NFSv4 epoch: new at every start (from the same randomness as the write verifier), so clientids and
        // stateids of an earlier start are recognised as such.
        let epoch = u32::from_be_bytes(verifier[4..].try_into().expect("4 bytes")) | 1;
        let mut cfg = cfg;
        // A first start (a state directory with no state file) has no clients whose state it could reclaim: no
        // grace period, as knfsd holds none when no client has state to reclaim. Without a state directory a
        // restart cannot be told from a first start, so the grace period stays.
        if let Some(dir) = &state_dir
            && matches!(dir.previous_session(), Ok(None))
            && cfg.nfs4.grace_ms > 0
        {
            tracing::info!("NFSv4: first start of this gateway (no state file): no grace period");
            cfg.nfs4.grace_ms = 0;
        }
        let nfs4 = nfs4::Server::new(cfg.nfs4, epoch, sealer.export_id(), OwnerKey::new(&key));
        let pnfs = match cfg.pnfs {
            PnfsMode::Off => false,
            PnfsMode::On => true,
            PnfsMode::Auto => match client.pnfs_devices().await {
                Ok(d) => d.iter().any(|d| !d.addrs.is_empty() || !d.rdma_addrs.is_empty()),
                Err(e) => {
                    tracing::warn!(error = %e, "asking the MDS for data servers' NFS addresses: pNFS off");
                    false
                }
            },
        };
        let session = client.mds_session();
        if let Some(dir) = &state_dir {
            adopt_previous(&client, dir, &nfs4).await;
            dir.record(session).map_err(|e| GatewayError::StateDir(format!("recording the MDS session: {e}")))?;
        }
        Ok(Arc::new_cyclic(|me| Gateway {
            me: me.clone(),
            cb_xid: AtomicU32::new(verifier[0] as u32),
            conn_ids: AtomicU64::new(1),
            nfs4,
            state_dir,
            recorded_session: AtomicU64::new(session),
            client,
            sealer,
            export_ino: root.ino,
            fsid,
            files,
            cursors: Mutex::new(Cursors::default()),
            pnfs,
            data_bytes: Mutex::new(DataBytes::default()),
            cfg: GatewayConfig { export, ..cfg },
        }))
    }

    /// The WRITE/COMMIT verifier: new at every start and whenever a data server lost unsynced writes
    /// (`files::WriteVerifier`), so clients resend uncommitted writes.
    pub fn write_verifier(&self) -> [u8; 8] {
        self.files.verifier.get()
    }

    pub fn export_path(&self) -> &str {
        &self.cfg.export
    }

    /// Serves `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let conns = Arc::new(Semaphore::new(self.cfg.connections_max.max(1)));
        let graced = self.clone();
        // When grace ends, the previous process's locks nobody reclaimed are unlocked.
        let _grace = AbortOnDrop(tokio::spawn(async move {
            let left_ms = graced.cfg.nfs4.grace_ms.saturating_sub(graced.nfs4.now_ms());
            tokio::time::sleep(std::time::Duration::from_millis(left_ms)).await;
            graced.release_unreclaimed().await;
        }));
        let idle = self.clone();
        // Aborted when `serve` is dropped (its caller stops the gateway by dropping the future).
        let _sweeper = AbortOnDrop(tokio::spawn(async move {
            let every = std::time::Duration::from_millis((idle.cfg.open_idle_ms / 2).max(100));
            loop {
                tokio::time::sleep(every).await;
                let n = idle.files.close_idle().await;
                if n > 0 {
                    tracing::debug!(closed = n, "closed idle open files");
                }
            }
        }));
        let checked = self.clone();
        // The periodic layout check (pNFS only): changes made elsewhere recall layouts too.
        let _check = AbortOnDrop(tokio::spawn(async move {
            if !checked.pnfs || checked.cfg.layout_check_ms == 0 {
                return;
            }
            let every = std::time::Duration::from_millis(checked.cfg.layout_check_ms);
            let mut cursor = 0;
            loop {
                tokio::time::sleep(every).await;
                cursor = checked.check_layouts(cursor).await;
            }
        }));
        // Peers outside `--allow` are answered only NULL and refusals, a few records each, and never hold one of
        // the `connections_max` permits: a flood of them cannot lock allowed clients out.
        let refused = Arc::new(Semaphore::new(REFUSED_CONNECTIONS_MAX));
        loop {
            let permit = conns.clone().acquire_owned().await.expect("never closed");
            let (stream, peer) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            };
            let gw = self.clone();
            let permit = if self.allowed(peer.ip()) {
                permit
            } else {
                drop(permit);
                let Ok(p) = refused.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, "refused address: {REFUSED_CONNECTIONS_MAX} such connections open, closed");
                    continue;
                };
                p
            };
            tokio::spawn(async move {
                gw.connection(stream, peer).await;
                drop(permit);
            });
        }
    }

    /// Unlocks what was adopted from the previous process and not reclaimed in the grace period.
    async fn release_unreclaimed(&self) {
        let pieces = self.nfs4.unreclaimed();
        let n = pieces.len();
        for (ino, owner, class, start, end) in pieces {
            let req = SetLockReq { ino, class, kind: None, start, end, owner, pid: 0 };
            if let Err(e) = self.client.set_lock(req).await {
                tracing::warn!(ino, owner, error = %e, "releasing an adopted lock nobody reclaimed");
            }
        }
        tracing::info!(released_ranges = n, "NFSv4 grace period over: released the adopted locks nobody reclaimed");
    }

    /// After a lock was set: if the MDS session changed (the MDS restarted, dropping every lock), records the new
    /// one, so a restart of this gateway adopts the locks it holds now.
    pub(crate) fn session_check(&self) {
        let Some(dir) = &self.state_dir else { return };
        let now = self.client.mds_session();
        if self.recorded_session.swap(now, Ordering::Relaxed) != now
            && let Err(e) = dir.record(now)
        {
            tracing::warn!(error = %e, "recording the gateway's new MDS session");
        }
    }

    /// Syncs and closes every cached open file (on SIGTERM), and logs the data bytes it moved per inode.
    pub async fn shutdown(&self) {
        self.files.close_all().await;
        let d = self.data_bytes.lock().expect("data bytes");
        for ino in &d.order {
            let (read, write) = d.map[ino];
            tracing::info!(ino, read_bytes = read, write_bytes = write, "gateway data bytes served");
        }
    }

    /// Whether NFSv4.1 clients are given pNFS layouts.
    pub fn pnfs(&self) -> bool {
        self.pnfs
    }

    /// Counts data bytes a READ or WRITE of `ino` moved through the gateway.
    pub(crate) fn moved(&self, ino: u64, read: usize, write: usize) {
        let mut d = self.data_bytes.lock().expect("data bytes");
        if !d.map.contains_key(&ino) {
            if d.order.len() >= DATA_BYTES_INODES_MAX
                && let Some(old) = d.order.pop_front()
            {
                d.map.remove(&old);
            }
            d.order.push_back(ino);
        }
        let e = d.map.entry(ino).or_default();
        e.0 += read as u64;
        e.1 += write as u64;
    }

    /// The READ and WRITE data bytes of `ino` the gateway moved (among the last [`DATA_BYTES_INODES_MAX`] inodes).
    pub fn data_bytes(&self, ino: u64) -> (u64, u64) {
        self.data_bytes.lock().expect("data bytes").map.get(&ino).copied().unwrap_or_default()
    }

    fn allowed(&self, peer: IpAddr) -> bool {
        self.cfg.allow.iter().any(|c| c.contains(peer))
    }

    async fn connection(self: Arc<Self>, stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let allowed = self.allowed(peer.ip());
        tracing::debug!(%peer, allowed, "connection");
        let (mut rd, wr) = stream.into_split();
        let wr = Arc::new(tokio::sync::Mutex::new(wr));
        // The connection's back-channel side: callbacks go out on `wr`, their replies come in below.
        let back = Arc::new(nfs4::callback::BackConn::new(wr.clone(), self.conn_ids.fetch_add(1, Ordering::Relaxed)));
        let inflight = Arc::new(Semaphore::new(self.cfg.requests_in_flight_max.max(1)));
        self.connection_loop(&mut rd, &wr, &back, peer, &inflight, allowed).await;
        back.close();
    }

    async fn connection_loop(
        self: &Arc<Self>,
        rd: &mut tokio::net::tcp::OwnedReadHalf,
        wr: &Arc<tokio::sync::Mutex<tokio::net::tcp::OwnedWriteHalf>>,
        back: &Arc<nfs4::callback::BackConn>,
        peer: SocketAddr,
        inflight: &Arc<Semaphore>,
        allowed: bool,
    ) {
        let d = self.cfg.deadlines;
        // A reply the peer did not take in time: the connection is closed (its record stream is cut).
        let dead = Arc::new(tokio::sync::Notify::new());
        let mut records = 0usize;
        loop {
            let next = tokio::select! {
                n = conn::next_record(rd, &self.cfg.record, &d) => n,
                () = dead.notified() => {
                    tracing::info!(%peer, send_ms = d.send_ms, "closing the connection: a reply was not read in time");
                    break;
                }
            };
            let rec = match next {
                conn::NextRecord::Record(r) => Bytes::from(r),
                conn::NextRecord::Closed => break,
                conn::NextRecord::Idle => {
                    tracing::debug!(%peer, idle_ms = d.idle_ms, "closing an idle connection");
                    break;
                }
                conn::NextRecord::Stalled => {
                    tracing::info!(%peer, frame_ms = d.frame_ms, "closing the connection: a record was not finished in time");
                    break;
                }
                // A client closing its connection (libnfs resets it) is not news.
                conn::NextRecord::Broken(rpc::RecordError::Io(e))
                    if e.kind() == std::io::ErrorKind::ConnectionReset =>
                {
                    break;
                }
                conn::NextRecord::Broken(e) => {
                    tracing::warn!(%peer, error = %e, "closing the connection");
                    break;
                }
            };
            records += 1;
            if !allowed && records > REFUSED_RECORDS_MAX {
                tracing::info!(%peer, "closing a connection from an address not in --allow");
                break;
            }
            // A REPLY (msg_type 1) is the answer to a callback this gateway sent on the connection.
            if rec.len() >= 8 && rec[4..8] == rpc::MSG_REPLY.to_be_bytes() {
                if !back.deliver(&rec) {
                    tracing::debug!(%peer, "a reply nobody waits for: dropped");
                }
                continue;
            }
            let permit = inflight.clone().acquire_owned().await.expect("never closed");
            let (gw, wr, back) = (self.clone(), wr.clone(), back.clone());
            let reply = match rpc::parse_call(&rec) {
                Ok(_) => None,
                Err(e) => {
                    tracing::info!(%peer, error = %e, "refused a call");
                    match e.reply() {
                        Some(r) => Some(r),
                        None if matches!(e, rpc::CallError::NoXid) => break,
                        None => continue,
                    }
                }
            };
            if let Some(r) = reply {
                if !conn::send_reply(&wr, &r.into(), &d).await {
                    break;
                }
                continue;
            }
            let dead = dead.clone();
            tokio::spawn(async move {
                if let Some(reply) = gw.handle_record_on(&rec, peer, Transport::Tcp, Some(back)).await
                    && !conn::send_reply(&wr, &reply, &d).await
                {
                    dead.notify_one();
                }
                drop(permit);
            });
        }
    }

    /// Handles one RPC call record, whichever transport it came on (the TCP loop above, the RPC-over-RDMA
    /// transport): returns the reply (header bytes plus an uncopied tail, a READ's data) or `None` when the
    /// record gets no answer (RFC 5531 has none for a message that is not a call). The caller frames the reply
    /// for its transport and bounds how many calls run at once.
    pub async fn handle_record(&self, rec: &Bytes, peer: SocketAddr, transport: Transport) -> Option<rpc::Reply> {
        self.handle_record_on(rec, peer, transport, None).await
    }

    /// [`Gateway::handle_record`] of a call that came on a TCP connection which can carry callbacks (`conn`).
    async fn handle_record_on(
        &self,
        rec: &Bytes,
        peer: SocketAddr,
        transport: Transport,
        conn: Option<Arc<nfs4::callback::BackConn>>,
    ) -> Option<rpc::Reply> {
        let call = match rpc::parse_call(rec) {
            Ok(c) => Call { transport, ..c },
            Err(e) => {
                tracing::info!(%peer, ?transport, error = %e, "refused a call");
                return e.reply().map(rpc::Reply::from);
            }
        };
        Some(self.dispatch(&call, rec, peer, self.allowed(peer.ip()), conn).await)
    }

    /// Runs one call; returns the whole reply message.
    async fn dispatch(
        &self,
        call: &Call<'_>,
        rec: &Bytes,
        peer: SocketAddr,
        allowed: bool,
        conn: Option<Arc<nfs4::callback::BackConn>>,
    ) -> rpc::Reply {
        // NULL of any served program answers everyone (clients probe with it before they mount).
        let null_of_served = call.proc_ == 0
            && matches!((call.prog, call.vers), (NFS_PROGRAM, NFS_V3 | NFS_V4) | (MOUNT_PROGRAM, MOUNT_V3));
        if !(allowed || null_of_served) {
            tracing::info!(%peer, prog = call.prog, proc = call.proc_, "refused: address not in --allow");
            if call.prog == MOUNT_PROGRAM && call.vers == MOUNT_V3 && call.proc_ == mount::MNT {
                return mount::refused(call.xid).into();
            }
            let mut w = rpc::denied(call.xid, 1);
            w.u32(rpc::AUTH_TOOWEAK);
            return w.buf.into();
        }
        if self.insecure_port(call, peer) && !null_of_served {
            tracing::info!(%peer, "refused: AUTH_SYS from an unprivileged port (the gateway runs with --secure)");
            let mut w = rpc::denied(call.xid, 1);
            w.u32(rpc::AUTH_TOOWEAK);
            return w.buf.into();
        }
        match (call.prog, call.vers) {
            (NFS_PROGRAM, NFS_V3) => nfs3::call(self, call, rec, peer).await,
            (NFS_PROGRAM, NFS_V4) => nfs4::compound::call(self, call, rec, peer, conn).await,
            (NFS_PROGRAM, _) => {
                let mut w = rpc::accepted(call.xid, rpc::PROG_MISMATCH);
                w.u32(NFS_V3).u32(NFS_V4);
                w.buf.into()
            }
            (MOUNT_PROGRAM, MOUNT_V3) => mount::call(self, call, peer).await.into(),
            (MOUNT_PROGRAM, _) => {
                let mut w = rpc::accepted(call.xid, rpc::PROG_MISMATCH);
                w.u32(MOUNT_V3).u32(MOUNT_V3);
                w.buf.into()
            }
            _ => rpc::accepted(call.xid, rpc::PROG_UNAVAIL).buf.into(),
        }
    }

    /// Whether `--secure` refuses `call`: an AUTH_SYS credential over TCP from a source port any user may bind
    /// (AUTH_NONE is served: it acts as nobody; RPC-over-RDMA peers are named by RDMA CM, not by a port).
    fn insecure_port(&self, call: &Call<'_>, peer: SocketAddr) -> bool {
        self.cfg.secure
            && call.transport == Transport::Tcp
            && matches!(call.auth, rpc::Auth::Sys { .. })
            && peer.port() >= PRIVILEGED_PORT_END
    }

    /// The client acting as the caller: AUTH_SYS ids (root squashed if the export says so), AUTH_NONE nobody.
    fn client_for(&self, auth: &Auth) -> Client {
        self.client.with_user(user_of(auth, self.cfg.root_squash))
    }

    fn remember_cursor(&self, dir: u64, cookie: u64, name: &str) {
        let mut c = self.cursors.lock().expect("cursors");
        if c.map.insert((dir, cookie), name.to_string()).is_none() {
            c.order.push_back((dir, cookie));
        }
        while c.order.len() > self.cfg.dir_cursors_max.max(1) {
            if let Some(old) = c.order.pop_front() {
                c.map.remove(&old);
            }
        }
    }

    fn cursor(&self, dir: u64, cookie: u64) -> Option<String> {
        self.cursors.lock().expect("cursors").map.get(&(dir, cookie)).cloned()
    }
}

/// Takes over the locks of the MDS session the state file names (the previous process of this gateway).
/// Failures are logged: the gateway serves anyway, and those locks then go as the MDS releases a vanished
/// session's (docs/format.md §14).
async fn adopt_previous(client: &Client, dir: &StateDir, nfs4: &nfs4::Server) {
    let previous = match dir.previous_session() {
        Ok(Some(p)) if p != client.mds_session() => p,
        Ok(_) => return,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring the gateway state file: no locks adopted");
            return;
        }
    };
    match client.adopt_locks(previous).await {
        Ok(r) => {
            tracing::info!(
                previous = format_args!("{previous:#x}"),
                locks = r.total,
                listed = r.locks.len(),
                "adopted the previous gateway process's locks: held for its clients' reclaims until grace ends"
            );
            nfs4.adopted(r.locks);
        }
        Err(e) => {
            tracing::warn!(previous = format_args!("{previous:#x}"), error = %e, "adopting the previous gateway process's locks")
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The user block a call runs as.
pub fn user_of(auth: &Auth, root_squash: bool) -> UserCred {
    let squash = |id: u32| if root_squash && id == 0 { NOBODY } else { id };
    let (uid, gid, groups) = match auth {
        Auth::None => (NOBODY, NOBODY, vec![]),
        Auth::Sys { uid, gid, gids, .. } => (squash(*uid), squash(*gid), gids.iter().map(|&g| squash(g)).collect()),
    };
    // At most 16 groups arrive (AUTH_SYS), under the user block's limit; an error cannot happen, but if it did the
    // caller would be nobody rather than someone else.
    weft_client::user_cred(uid, gid, groups).unwrap_or(UserCred { uid: NOBODY, gid: NOBODY, groups: vec![] })
}

fn normalize_export(path: &str) -> Result<String, GatewayError> {
    let comps = weft_client::components(path)
        .map_err(|e| GatewayError::Export { path: path.to_string(), error: e.to_string() })?;
    Ok(format!("/{}", comps.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_match() {
        let lo: Cidr = "127.0.0.1/32".parse().unwrap();
        assert!(lo.contains("127.0.0.1".parse().unwrap()));
        assert!(!lo.contains("127.0.0.2".parse().unwrap()));
        assert!(lo.contains("::ffff:127.0.0.1".parse().unwrap()), "v4-mapped v6 is the v4 address");
        let loopback = parse_allow("127.0.0.0/8,::1/128,127.0.0.2/32").unwrap();
        assert!(loopback.iter().all(Cidr::is_loopback), "the default allow list is loopback only");
        let wide = parse_allow("127.0.0.0/7,10.0.0.0/8,::/0").unwrap();
        assert!(!wide.iter().any(Cidr::is_loopback), "{wide:?} reach beyond loopback");
        let net = parse_allow("10.0.0.0/8, ::1").unwrap();
        assert!(net[0].contains("10.200.1.1".parse().unwrap()));
        assert!(!net[0].contains("11.0.0.1".parse().unwrap()));
        assert!(net[1].contains("::1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("host".parse::<Cidr>().is_err());
    }

    #[test]
    fn root_is_squashed_and_anonymous_is_nobody() {
        let sys = |uid, gid, gids: Vec<u32>| Auth::Sys { stamp: 0, machine: "m".into(), uid, gid, gids };
        assert_eq!(user_of(&sys(0, 0, vec![0, 5]), true), UserCred { uid: NOBODY, gid: NOBODY, groups: vec![5] });
        assert_eq!(user_of(&sys(0, 0, vec![5]), false), UserCred { uid: 0, gid: 0, groups: vec![5] });
        assert_eq!(user_of(&sys(1000, 100, vec![100, 7]), true), UserCred { uid: 1000, gid: 100, groups: vec![7] });
        assert_eq!(user_of(&Auth::None, false), UserCred { uid: NOBODY, gid: NOBODY, groups: vec![] });
    }
}
