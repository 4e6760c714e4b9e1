//! `weft data --config F`: the data server's TOML configuration, its serde defaults and the buffer pool's size
//! classes derived from it.

use std::path::PathBuf;

use serde::Deserialize;
use weft_rpc::{AuthMode, PoolClass};

/// `weft data --config F`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// Stable id of this server; layouts refer to it.
    pub id: u32,
    /// Address to listen on (`host:0` picks a free port).
    pub listen: String,
    /// Address clients should use, if not the listening one (e.g. behind NAT or when listening on 0.0.0.0).
    #[serde(default)]
    pub advertise: Option<String>,
    /// Directory holding the objects.
    pub root: PathBuf,
    /// Serve Prometheus metrics over HTTP at `GET /metrics` on this address (`127.0.0.1:9100`; port 0: any free
    /// port). Off when absent. Plain HTTP without authentication: keep it on loopback or a management network.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// The metadata services to register with: one address, or several separated by commas (the services of one
    /// database, or one service's possible homes). A heartbeat goes to every one (each service must hear every
    /// data server, docs/format.md §28); one that does not answer is tried again at the next heartbeat.
    pub mds: String,
    /// The cluster key file (docs/format.md §9): proved to the MDS, and asked of every client; required with
    /// `auth = "key"`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// `key` (default) or `none` (no authentication at all; warns loudly at start).
    #[serde(default)]
    pub auth: AuthMode,
    /// The clients keyring (`weft key add`, docs/format.md §9): per-client keys accepted besides the cluster key,
    /// re-read when it changes. None: only the cluster key is accepted.
    #[serde(default)]
    pub clients_keyring: Option<PathBuf>,
    /// Run `tcp` under TLS 1.3 (docs/format.md §11): listen with `tls_cert_file`/`tls_key_file`, verify servers
    /// against `tls_ca_file`. `shm` and `rdma` are unaffected.
    #[serde(default)]
    pub tls: bool,
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// The lease to serve clients (docs/format.md §19, fencing): client I/O is served only while the last heartbeat
    /// reply said this server is up and that heartbeat was sent less than this long ago; else `StaleLayout`. The
    /// lease in force is at most half the MDS's `rebuild_after_ms` (sent in the reply), so a silent server stops
    /// serving before its slots move to spares. At least twice `heartbeat_ms`. Default 150000.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// Largest payload of one request (a transfer unit); also the size of the largest pool buffers.
    #[serde(default = "default_transfer_unit")]
    pub transfer_unit_bytes: u32,
    /// Buffers of the transfer unit's size in the pool (the largest class; see [`DataConfig::pool_classes`]).
    #[serde(default = "default_pool_buffers")]
    pub pool_buffers: u32,
    /// The pool's size classes below the transfer unit (`[[pool_classes]]` tables of `buf_bytes` and `buffers`);
    /// empty picks [`DEFAULT_POOL_CLASSES`]. Each class is one zone, allocated and pre-faulted at start; payload
    /// memory is bounded by the sum of `buffers × buf_bytes` over the classes plus `pool_buffers ×
    /// transfer_unit_bytes`.
    #[serde(default)]
    pub pool_classes: Vec<PoolClassConfig>,
    /// One-sided transfers larger than this move in pieces of this size (a multiple of 4096), the disk working on
    /// one piece while the fabric moves the next.
    #[serde(default = "default_pipeline_piece")]
    pub pipeline_piece_bytes: u32,
    /// The same for fabrics that move bytes without the CPU (`rdma`: the NIC does the transfer, so overlapping it
    /// with the disk costs no core; `pipeline_piece_bytes` applies to `shm`, whose transfer is a CPU copy).
    #[serde(default = "default_rdma_pipeline_piece")]
    pub rdma_pipeline_piece_bytes: u32,
    #[serde(default = "default_slots_max")]
    pub slots_max: u32,
    #[serde(default = "default_sessions_max")]
    pub sessions_max: u32,
    /// Benchmarks only (Sandia's short circuit, `weft bench --short-circuit server`): writes are discarded and
    /// reads served as zeros without touching the disk, showing the ceiling of everything before the store.
    #[serde(default)]
    pub short_circuit: bool,
    /// Also listen for same-host clients on the `shm` fabric, at `shm_socket` (default `ROOT/weft-data.sock`).
    #[serde(default = "default_true")]
    pub shm: bool,
    #[serde(default)]
    pub shm_socket: Option<PathBuf>,
    /// Group (name or number) whose members may connect to the shm socket too (mode 0660 in that group); without
    /// one the socket is mode 0600: only this server's user and root.
    #[serde(default)]
    pub shm_socket_group: Option<String>,
    /// Largest arena a shm client may hand over (bytes); a larger one is refused at the hello.
    #[serde(default = "default_shm_arena_bytes_max")]
    pub shm_arena_bytes_max: u64,
    /// Also listen for `rdma` clients when this host has an RDMA device (libibverbs and a device; the side
    /// channel listens on the TCP listener's address, port `rdma_port`, 0 = any free port).
    #[serde(default = "default_true")]
    pub rdma: bool,
    #[serde(default)]
    pub rdma_port: u16,
    /// rdma handshakes (side-channel authentication, queue pairs, hello) in progress at once; more wait.
    #[serde(default = "default_rdma_handshakes_max")]
    pub rdma_handshakes_max: u32,
    /// A whole rdma handshake, the wait for a turn included, must finish within this time.
    #[serde(default = "default_rdma_handshake_timeout_ms")]
    pub rdma_handshake_timeout_ms: u64,
    /// How far this server's clock may be behind the MDS's: a capability is refused only this long after its
    /// expiry (docs/format.md §10).
    #[serde(default = "default_capability_clock_skew_ms")]
    pub capability_clock_skew_ms: u64,
    /// How long an inode whose object the MDS removed is remembered (any request on it is refused meanwhile, so an
    /// old capability cannot recreate the object). Must exceed the MDS's `capability_ttl_ms` plus the skew.
    #[serde(default = "default_removed_inode_memory_ms")]
    pub removed_inode_memory_ms: u64,
    /// At most this many removed inodes are remembered (the oldest forgotten first).
    #[serde(default = "default_removed_inodes_max")]
    pub removed_inodes_max: u32,
    /// Cache-bank jobs (fills after reads, invalidations after writes) waiting at once, in one FIFO queue. A fill
    /// that finds it full is dropped (counted); an invalidation waits for room, holding its write's reply back.
    #[serde(default = "default_cache_fill_queue_max")]
    pub cache_fill_queue_max: u32,
    /// Data versions remembered per inode from fill hints (a write deletes its blocks under each).
    #[serde(default = "default_cache_versions_per_inode")]
    pub cache_versions_per_inode: u32,
    /// Inodes whose recent data versions are remembered (the least recently read forgotten first).
    #[serde(default = "default_cache_recent_inodes_max")]
    pub cache_recent_inodes_max: u32,
    /// Blocks remembered as stored in the bank lately: a fill skips storing them again (0: every fill stores).
    #[serde(default = "default_cache_filled_recent_max")]
    pub cache_filled_recent_max: u32,
    /// The cache bank (`weft_cache::CacheConfig`, the `[cache]` table `weft up --cache N` writes): with `data =
    /// true` this server stores the blocks it reads for a client that asks (a fill hint) and deletes those a write
    /// changes. Absent: no bank.
    #[serde(default)]
    pub cache: Option<weft_cache::CacheConfig>,
    /// Also serve pNFS as an NFSv4.1 data server (docs/format.md §23) on these `ip:port` addresses (port 0: a free
    /// one). Empty (the default): no NFS. Clients reach it with the filehandles of a layout the gateway handed out.
    #[serde(default)]
    pub nfs_listen: Vec<String>,
    /// The NFS addresses told to the MDS (and so to pNFS clients in GETDEVICEINFO), if not the listening ones: e.g.
    /// `10.0.2.2:P` for a qemu guest whose host listens on `127.0.0.1:P`; `rdma:ip:port` for RPC-over-RDMA. Empty:
    /// the addresses actually bound.
    #[serde(default)]
    pub nfs_advertise: Vec<String>,
    /// Also serve pNFS over RPC-over-RDMA (RFC 8166; docs/format.md §23, §25) at this `ip:port` (an address of an
    /// RDMA device, e.g. rxe0's; a fixed port: 20049 is NFS over RDMA's). Off (the default) when absent. Announced
    /// to the MDS as `rdma:ip:port` (unless `nfs_advertise` is set, which then lists every address).
    #[serde(default)]
    pub nfs_rdma_listen: Option<String>,
    /// NFS connections served at once; more are closed at accept.
    #[serde(default = "default_nfs_connections_max")]
    pub nfs_connections_max: u32,
    /// NFSv4.1 client ids (EXCHANGE_ID) held at once; past it EXCHANGE_ID answers NFS4ERR_RESOURCE.
    #[serde(default = "default_nfs_clients_max")]
    pub nfs_clients_max: u32,
    /// NFSv4.1 sessions held at once (all clients); past it CREATE_SESSION answers NFS4ERR_RESOURCE.
    #[serde(default = "default_nfs_sessions_max")]
    pub nfs_sessions_max: u32,
}

fn default_nfs_connections_max() -> u32 {
    256
}
fn default_nfs_clients_max() -> u32 {
    256
}
fn default_nfs_sessions_max() -> u32 {
    256
}

fn default_cache_fill_queue_max() -> u32 {
    4096
}
fn default_cache_versions_per_inode() -> u32 {
    4
}
fn default_cache_recent_inodes_max() -> u32 {
    65_536
}
/// 64 Ki blocks (a few MiB of bookkeeping; 512 MiB of data at 8 KiB blocks).
fn default_cache_filled_recent_max() -> u32 {
    65_536
}

fn default_capability_clock_skew_ms() -> u64 {
    5_000
}
/// Ten minutes: well past the default capability lifetime (60 s) plus the skew.
fn default_removed_inode_memory_ms() -> u64 {
    600_000
}
/// 64 Ki inodes, a few MiB at most.
fn default_removed_inodes_max() -> u32 {
    65_536
}

/// One size class of the data server's buffer pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolClassConfig {
    pub buf_bytes: u32,
    pub buffers: u32,
}

/// Classes below the transfer unit, by default: 64 KiB for small I/O (the arena size class of the papers),
/// 256 KiB for medium payloads and short pipeline pieces, 1 MiB for the client's usual transfer unit (over TCP)
/// and for pipeline pieces (two per large one-sided transfer in flight). With 32 transfer-unit buffers of 2 MiB,
/// 92 MiB in all.
pub const DEFAULT_POOL_CLASSES: [PoolClassConfig; 3] = [
    PoolClassConfig { buf_bytes: 64 << 10, buffers: 64 },
    PoolClassConfig { buf_bytes: 256 << 10, buffers: 32 },
    PoolClassConfig { buf_bytes: 1 << 20, buffers: 16 },
];

impl DataConfig {
    /// Checks the keys that must agree: a lease shorter than two heartbeats would lapse between healthy ones.
    pub fn check(&self) -> Result<(), String> {
        if self.lease_ms < self.heartbeat_ms.saturating_mul(2) {
            return Err(format!(
                "lease_ms ({}) must be at least twice heartbeat_ms ({}): the lease would lapse between heartbeats",
                self.lease_ms, self.heartbeat_ms
            ));
        }
        Ok(())
    }

    /// The limits of the cache bank's fill queue and recent-versions map.
    pub fn fill_limits(&self) -> crate::cache_fill::FillLimits {
        crate::cache_fill::FillLimits {
            queue_max: self.cache_fill_queue_max.max(1) as usize,
            versions_per_inode: self.cache_versions_per_inode.max(1) as usize,
            inodes_max: self.cache_recent_inodes_max.max(1) as usize,
            filled_recent_max: self.cache_filled_recent_max as usize,
        }
    }

    /// The TLS setup this config names (`tls = true`), or `None` for plain tcp.
    pub fn tls_config(&self) -> Result<Option<weft_fabric::TlsConfig>, weft_fabric::TlsError> {
        let files = weft_fabric::TlsFiles {
            ca_file: self.tls_ca_file.clone(),
            cert_file: self.tls_cert_file.clone(),
            key_file: self.tls_key_file.clone(),
        };
        weft_fabric::tls::server_tls(self.tls, &files)
    }

    /// The pool's classes: the configured (or default) ones smaller than the transfer unit, then
    /// `pool_buffers` buffers of the transfer unit, so every payload the server accepts fits a class.
    pub fn pool_classes(&self) -> Vec<PoolClass> {
        let unit = self.transfer_unit_bytes.max(1);
        let below: &[PoolClassConfig] =
            if self.pool_classes.is_empty() { &DEFAULT_POOL_CLASSES } else { &self.pool_classes };
        let mut v: Vec<PoolClass> = below
            .iter()
            .filter(|c| c.buf_bytes < unit)
            .map(|c| PoolClass { buf_bytes: c.buf_bytes as usize, buffers: c.buffers })
            .collect();
        v.push(PoolClass { buf_bytes: unit as usize, buffers: self.pool_buffers.max(1) });
        v
    }
}

/// Pieces of a pipelined one-sided transfer, by default: the client's 1 MiB transfer unit moves whole, a 2 MiB one
/// in two pieces. Smaller pieces (256 KiB) measured slower here with 8 units in flight on 2 cores: units in
/// flight already overlap disk and transfer, and each piece costs two hand-offs and its own mapping (see
/// ARCHITECTURE.md, "Double buffering").
pub const DEFAULT_PIPELINE_PIECE_BYTES: u32 = 1 << 20;

/// Pieces of a pipelined transfer over a fabric whose transfers do not use the CPU (`rdma`): four per 1 MiB unit,
/// so the disk reads or writes one piece while the NIC moves another.
pub const DEFAULT_RDMA_PIPELINE_PIECE_BYTES: u32 = 256 << 10;

fn default_rdma_handshakes_max() -> u32 {
    64
}
fn default_rdma_handshake_timeout_ms() -> u64 {
    10_000
}
fn default_shm_arena_bytes_max() -> u64 {
    weft_fabric::shm::ARENA_BYTES_MAX_DEFAULT
}
fn default_true() -> bool {
    true
}
fn default_heartbeat_ms() -> u64 {
    1000
}
fn default_lease_ms() -> u64 {
    crate::lease::DEFAULT_LEASE_MS
}
fn default_transfer_unit() -> u32 {
    2 << 20
}
fn default_pool_buffers() -> u32 {
    32
}
fn default_pipeline_piece() -> u32 {
    DEFAULT_PIPELINE_PIECE_BYTES
}
fn default_rdma_pipeline_piece() -> u32 {
    DEFAULT_RDMA_PIPELINE_PIECE_BYTES
}
fn default_slots_max() -> u32 {
    64
}
fn default_sessions_max() -> u32 {
    1024
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields `weft up` and the launcher write; everything else takes its default.
    #[test]
    fn a_minimal_config_takes_the_defaults() {
        let cfg: DataConfig =
            toml::from_str("id = 3\nlisten = \"127.0.0.1:0\"\nroot = \"/srv/d3\"\nmds = \"127.0.0.1:7000\"\n").unwrap();
        assert_eq!((cfg.id, cfg.listen.as_str(), cfg.mds.as_str()), (3, "127.0.0.1:0", "127.0.0.1:7000"));
        assert_eq!(cfg.root, PathBuf::from("/srv/d3"));
        assert_eq!(cfg.advertise, None);
        assert_eq!((cfg.key_file.clone(), cfg.auth), (None, AuthMode::Key));
        assert_eq!((cfg.heartbeat_ms, cfg.lease_ms), (1000, 150_000));
        assert_eq!(cfg.check(), Ok(()));
        let short = DataConfig { lease_ms: 1999, ..cfg.clone() };
        assert!(short.check().unwrap_err().contains("at least twice heartbeat_ms"));
        assert_eq!(cfg.transfer_unit_bytes, 2 << 20);
        assert_eq!(cfg.pool_buffers, 32);
        assert!(cfg.pool_classes.is_empty());
        assert_eq!(cfg.pipeline_piece_bytes, DEFAULT_PIPELINE_PIECE_BYTES);
        assert_eq!(cfg.rdma_pipeline_piece_bytes, DEFAULT_RDMA_PIPELINE_PIECE_BYTES);
        assert_eq!((cfg.slots_max, cfg.sessions_max), (64, 1024));
        assert!(!cfg.short_circuit);
        assert!(cfg.shm && cfg.rdma);
        assert_eq!((cfg.shm_socket, cfg.rdma_port), (None, 0));
        assert_eq!(
            (cfg.capability_clock_skew_ms, cfg.removed_inode_memory_ms, cfg.removed_inodes_max),
            (5000, 600_000, 65_536)
        );
        assert_eq!(
            (cfg.cache_fill_queue_max, cfg.cache_versions_per_inode, cfg.cache_recent_inodes_max),
            (4096, 4, 65_536)
        );
        assert_eq!(cfg.cache_filled_recent_max, 65_536);
        assert_eq!(cfg.cache, None);
    }

    #[test]
    fn every_field_is_read_and_unknown_ones_are_refused() {
        let text = r#"
            id = 1
            listen = "0.0.0.0:7100"
            advertise = "10.0.0.1:7100"
            root = "/d"
            mds = "m:7000"
            key_file = "/d/cluster.key"
            auth = "none"
            heartbeat_ms = 250
            transfer_unit_bytes = 1048576
            pool_buffers = 8
            pipeline_piece_bytes = 524288
            rdma_pipeline_piece_bytes = 131072
            slots_max = 16
            sessions_max = 32
            short_circuit = true
            shm = false
            shm_socket = "/run/d.sock"
            rdma = false
            rdma_port = 7101
            capability_clock_skew_ms = 10
            removed_inode_memory_ms = 20
            removed_inodes_max = 30
            cache_fill_queue_max = 40
            cache_versions_per_inode = 2
            cache_recent_inodes_max = 50
            cache_filled_recent_max = 60
            [[pool_classes]]
            buf_bytes = 65536
            buffers = 4
            [[pool_classes]]
            buf_bytes = 4194304
            buffers = 2
            [cache]
            servers = ["127.0.0.1:11211"]
            block_bytes = 2048
        "#;
        let cfg: DataConfig = toml::from_str(text).unwrap();
        assert_eq!(cfg.advertise.as_deref(), Some("10.0.0.1:7100"));
        assert_eq!((cfg.key_file.clone(), cfg.auth), (Some(PathBuf::from("/d/cluster.key")), AuthMode::None));
        assert_eq!((cfg.heartbeat_ms, cfg.transfer_unit_bytes, cfg.pool_buffers), (250, 1 << 20, 8));
        assert_eq!((cfg.pipeline_piece_bytes, cfg.rdma_pipeline_piece_bytes), (512 << 10, 128 << 10));
        assert_eq!((cfg.slots_max, cfg.sessions_max, cfg.rdma_port), (16, 32, 7101));
        assert_eq!((cfg.capability_clock_skew_ms, cfg.removed_inode_memory_ms, cfg.removed_inodes_max), (10, 20, 30));
        assert!(cfg.short_circuit && !cfg.shm && !cfg.rdma);
        let limits = cfg.fill_limits();
        assert_eq!((limits.queue_max, limits.versions_per_inode, limits.inodes_max), (40, 2, 50));
        assert_eq!(limits.filled_recent_max, 60);
        let cache = cfg.cache.as_ref().expect("the [cache] table");
        assert_eq!((cache.servers.len(), cache.block_bytes, cache.data), (1, 2048, true));
        assert_eq!(cfg.shm_socket, Some(PathBuf::from("/run/d.sock")));
        // Classes at or above the transfer unit are dropped; the unit's own class comes last.
        let classes: Vec<(usize, u32)> = cfg.pool_classes().iter().map(|c| (c.buf_bytes, c.buffers)).collect();
        assert_eq!(classes, vec![(64 << 10, 4), (1 << 20, 8)]);
        assert!(toml::from_str::<DataConfig>(&format!("unknown = 1\n{text}")).is_err());
        assert!(toml::from_str::<DataConfig>(&format!("{text}\nunknown = 1\n")).is_err(), "nor in [cache]");
    }
}
