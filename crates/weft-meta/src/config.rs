//! `weft meta --config F`: the metadata service's TOML configuration and its serde defaults.

use std::path::PathBuf;

use serde::Deserialize;

use weft_rpc::AuthMode;

use crate::JournalConfig;

/// `weft meta --config F`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaConfig {
    /// Address to listen on (`host:0` picks a free port).
    pub listen: String,
    /// Also serve clients over the `rdma` fabric's messages at this address (`rdma:host:port`), e.g. on a cluster
    /// whose clients reach nothing else; off by default (metadata is never on the data path).
    #[serde(default)]
    pub rdma_listen: Option<String>,
    /// Serve Prometheus metrics over HTTP at `GET /metrics` on this address (`127.0.0.1:9100`; port 0: any free
    /// port). Off when absent. Plain HTTP without authentication: keep it on loopback or a management network.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// Directory of the embedded store (`meta.redb`).
    pub data_dir: PathBuf,
    /// Keep the namespace in this PostgreSQL database instead (`postgres://user@host/db` or a `key=value`
    /// connection string; no TLS), which several metadata services may share (docs/format.md §26). Absent: the
    /// embedded store in `data_dir`.
    #[serde(default)]
    pub db: Option<String>,
    /// Most connections to `db` this service holds (each runs one transaction at a time; more ops wait).
    #[serde(default = "default_db_connections_max")]
    pub db_connections_max: usize,
    /// With `db`: how long a metadata transaction waits for a writable PostgreSQL server once the service has
    /// connected (a primary lost, a standby being promoted), in milliseconds. List every server in `db`
    /// (`host=a,b … target_session_attrs=read-write`) so the promoted one is found.
    #[serde(default = "default_db_failover_timeout_ms")]
    pub db_failover_timeout_ms: u64,
    /// The cluster key file (docs/format.md §9): every connection must prove it; required with `auth = "key"`.
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
    /// A data server unheard of for this long is reported down.
    #[serde(default = "default_liveness_ms")]
    pub liveness_ms: u64,
    #[serde(default = "default_slots_max")]
    pub slots_max: u32,
    #[serde(default = "default_sessions_max")]
    pub sessions_max: u32,
    /// Most sessions one per-client key holds at once (the cluster key is not counted), so one client cannot fill
    /// the table for everyone; past it a new session is refused (`Busy`) with a log line naming the key.
    #[serde(default = "default_sessions_per_key_max")]
    pub sessions_per_key_max: u32,
    /// How often removed files' objects are collected from the data servers.
    #[serde(default = "default_gc_interval_ms")]
    pub gc_interval_ms: u64,
    /// A data server silent this long (milliseconds) is declared failed: its slots in every redundant (ec, mirror)
    /// layout move to spares and are rebuilt there; one that returns later is drained first (docs/format.md §19).
    /// Default five minutes; test clusters use seconds. At least `liveness_ms`.
    #[serde(default = "default_rebuild_after_ms")]
    pub rebuild_after_ms: u64,
    /// How often the membership task runs (milliseconds): phase changes, one batch of the spare scan, one batch of a
    /// drain.
    #[serde(default = "default_membership_interval_ms")]
    pub membership_interval_ms: u64,
    /// With several services on one database: the duty lease's time (milliseconds, docs/format.md §28). The
    /// holder renews it every third of it; when the holder dies, another service takes the duties (membership,
    /// drains, orphan collection, healing) this long after its last renewal. At least 300.
    #[serde(default = "default_duty_lease_ms")]
    pub duty_lease_ms: u64,
    /// Size each metadata journal segment is preallocated to.
    #[serde(default = "default_journal_segment_bytes")]
    pub journal_segment_bytes: u64,
    /// Journal bytes not yet checkpointed above which writers wait for a checkpoint (back-pressure).
    #[serde(default = "default_journal_bytes_max")]
    pub journal_bytes_max: u64,
    /// Journal bytes since the last checkpoint that trigger the next one.
    #[serde(default = "default_checkpoint_bytes")]
    pub checkpoint_bytes: u64,
    /// Longest a journaled change waits for a checkpoint into the store (bounds replay time after a crash).
    #[serde(default = "default_checkpoint_interval_ms")]
    pub checkpoint_interval_ms: u64,
    /// Lifetime of the capabilities `Open` issues (docs/format.md §10): bounds how long a removed permission keeps
    /// working on the data servers; clients renew before it runs out.
    #[serde(default = "default_capability_ttl_ms")]
    pub capability_ttl_ms: u64,
    /// Lifetime of the capabilities inside pNFS data-server filehandles (`PnfsHandle`, docs/format.md §23): a
    /// layout's handles stop working this long after the gateway asked for them (the data server answers
    /// `NFS4ERR_STALE` and the client gets a fresh layout). Default 60 s, a capability's lifetime: a client that
    /// ignores the gateway's recall after a chmod keeps its access no longer than any other capability holder.
    #[serde(default = "default_pnfs_handle_ttl_ms")]
    pub pnfs_handle_ttl_ms: u64,
    /// The cache bank (issue 16): with `attrs = true` the MDS publishes every change of attributes and names to
    /// these memcached daemons before replying. Absent: no bank.
    #[serde(default)]
    pub cache: Option<weft_cache::CacheConfig>,
    /// Most bytes of extended attributes (names plus values, ACLs included) one inode may hold; a set past it is
    /// refused with ENOSPC. Raised to at least one largest value (64 KiB) with a longest name.
    #[serde(default = "default_xattr_bytes_max_per_inode")]
    pub xattr_bytes_max_per_inode: usize,
    /// Most advisory locks (POSIX ranges and `flock` locks, all clients) held at once; a lock past it is refused
    /// with ENOLCK (docs/format.md §14).
    #[serde(default = "default_locks_max")]
    pub locks_max: usize,
    /// Most locks one session of a per-client key holds (the cluster key's sessions are bounded by `locks_max`
    /// only), so one client cannot fill the table for everyone; a lock past it is refused with ENOLCK, logged
    /// with the key. Not applied with several services on one database (their locks live in it, per inode).
    #[serde(default = "default_locks_per_client_session_max")]
    pub locks_per_client_session_max: usize,
    /// How long a client session that holds locks may stay away after its connection closed (a reconnect) before
    /// its locks are released.
    #[serde(default = "default_locks_grace_ms")]
    pub locks_grace_ms: u64,
    /// Metadata leases (docs/format.md §31): how long a client may trust attributes and entries it caches after
    /// its last answered lease poll, and the longest a change waits for a client that does not acknowledge a
    /// recall. 0: no leases (clients fall back to their attribute timeouts). Granted on an embedded store only.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// With several services on one database: the locks of sessions at a service silent this long are released
    /// by the duty holder (format §30); their clients had that long to fail over and take them over.
    #[serde(default = "default_locks_orphan_ms")]
    pub locks_orphan_ms: u64,
    /// Run the healer beside the MDS (`weft meta`): it catches data servers up on the rows of redundant files
    /// they missed (docs/format.md §18).
    #[serde(default = "default_heal")]
    pub heal: bool,
    /// Most MiB per second the healer writes (catch-up and rebuild), held by a token bucket (a quarter second's
    /// worth of burst); 0: unthrottled.
    #[serde(default = "default_rebuild_mib_per_s")]
    pub rebuild_mib_per_s: u64,
    /// How often an idle healer looks for stale ranges (`weft heal --now` wakes it at once).
    #[serde(default = "default_heal_interval_ms")]
    pub heal_interval_ms: u64,
    /// Most stale ranges one (file, slot) keeps; more collapse to the whole slot (healed whole).
    #[serde(default = "default_stale_ranges_per_slot_max")]
    pub stale_ranges_per_slot_max: usize,
    /// Most (file, slot) entries in the stale-range table; a degraded write needing a new one past it fails
    /// (ENOSPC) rather than being acknowledged unrecorded.
    #[serde(default = "default_stale_entries_max")]
    pub stale_entries_max: u64,
    /// The background scrubber `weft meta` runs beside the service (docs/format.md §20): MiB per second it
    /// verifies and reads at most; 0 turns it off.
    #[serde(default = "default_scrub_mib_per_s")]
    pub scrub_mib_per_s: u64,
    /// Time from the start of one background scrub pass over the whole namespace to the start of the next.
    #[serde(default = "default_scrub_interval_ms")]
    pub scrub_interval_ms: u64,
}

fn default_db_failover_timeout_ms() -> u64 {
    crate::pg_store::DEFAULT_DB_FAILOVER_TIMEOUT_MS
}
fn default_db_connections_max() -> usize {
    crate::pg_store::DEFAULT_CONNECTIONS_MAX
}
fn default_scrub_mib_per_s() -> u64 {
    20
}
fn default_scrub_interval_ms() -> u64 {
    24 * 3600 * 1000
}

impl MetaConfig {
    /// The TLS setup this config names (`tls = true`), or `None` for plain tcp.
    pub fn tls_config(&self) -> Result<Option<weft_fabric::TlsConfig>, weft_fabric::TlsError> {
        let files = weft_fabric::TlsFiles {
            ca_file: self.tls_ca_file.clone(),
            cert_file: self.tls_cert_file.clone(),
            key_file: self.tls_key_file.clone(),
        };
        weft_fabric::tls::server_tls(self.tls, &files)
    }

    /// The store's journal limits from this config.
    pub fn journal(&self) -> JournalConfig {
        JournalConfig {
            segment_bytes: self.journal_segment_bytes,
            journal_bytes_max: self.journal_bytes_max,
            checkpoint_bytes: self.checkpoint_bytes,
            checkpoint_interval_ms: self.checkpoint_interval_ms,
        }
    }
}

fn default_capability_ttl_ms() -> u64 {
    crate::service::DEFAULT_CAPABILITY_TTL_MS
}
fn default_pnfs_handle_ttl_ms() -> u64 {
    crate::service::DEFAULT_PNFS_HANDLE_TTL_MS
}
fn default_xattr_bytes_max_per_inode() -> usize {
    crate::namespace::DEFAULT_XATTR_BYTES_MAX_PER_INODE
}
fn default_locks_per_client_session_max() -> usize {
    4096
}
fn default_locks_max() -> usize {
    crate::locks::DEFAULT_LOCKS_MAX
}
pub use crate::locks::DEFAULT_LOCKS_ORPHAN_MS;

fn default_locks_orphan_ms() -> u64 {
    DEFAULT_LOCKS_ORPHAN_MS
}

fn default_lease_ms() -> u64 {
    crate::leases::DEFAULT_LEASE_MS
}

fn default_locks_grace_ms() -> u64 {
    crate::lock_sessions::DEFAULT_LOCKS_GRACE_MS
}
fn default_heal() -> bool {
    true
}
fn default_rebuild_mib_per_s() -> u64 {
    200
}
fn default_heal_interval_ms() -> u64 {
    10_000
}
fn default_stale_ranges_per_slot_max() -> usize {
    crate::stale::DEFAULT_STALE_RANGES_PER_SLOT_MAX
}
fn default_stale_entries_max() -> u64 {
    crate::stale::DEFAULT_STALE_ENTRIES_MAX
}
fn default_liveness_ms() -> u64 {
    5000
}
fn default_slots_max() -> u32 {
    64
}
fn default_sessions_max() -> u32 {
    4096
}
fn default_sessions_per_key_max() -> u32 {
    256
}
fn default_rebuild_after_ms() -> u64 {
    crate::membership::DEFAULT_REBUILD_AFTER_MS
}
fn default_membership_interval_ms() -> u64 {
    crate::membership::DEFAULT_MEMBERSHIP_INTERVAL_MS
}
fn default_duty_lease_ms() -> u64 {
    crate::duty::DEFAULT_DUTY_LEASE_MS
}
fn default_gc_interval_ms() -> u64 {
    1000
}
fn default_journal_segment_bytes() -> u64 {
    JournalConfig::default().segment_bytes
}
fn default_journal_bytes_max() -> u64 {
    JournalConfig::default().journal_bytes_max
}
fn default_checkpoint_bytes() -> u64 {
    JournalConfig::default().checkpoint_bytes
}
fn default_checkpoint_interval_ms() -> u64 {
    JournalConfig::default().checkpoint_interval_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields `weft up` and the launcher write; everything else takes its default.
    #[test]
    fn a_minimal_config_takes_the_defaults() {
        let cfg: MetaConfig = toml::from_str("listen = \"127.0.0.1:0\"\ndata_dir = \"/srv/meta\"\n").unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:0");
        assert_eq!(cfg.data_dir, PathBuf::from("/srv/meta"));
        assert_eq!((cfg.rdma_listen.clone(), cfg.db.clone()), (None, None), "the embedded store by default");
        assert_eq!((cfg.key_file.clone(), cfg.auth), (None, AuthMode::Key));
        assert_eq!((cfg.liveness_ms, cfg.slots_max, cfg.sessions_max, cfg.gc_interval_ms), (5000, 64, 4096, 1000));
        let journal = cfg.journal();
        let default = JournalConfig::default();
        assert_eq!(journal.segment_bytes, default.segment_bytes);
        assert_eq!(journal.journal_bytes_max, default.journal_bytes_max);
        assert_eq!(journal.checkpoint_bytes, default.checkpoint_bytes);
        assert_eq!(journal.checkpoint_interval_ms, default.checkpoint_interval_ms);
        assert_eq!(cfg.capability_ttl_ms, 60_000);
        assert_eq!(cfg.pnfs_handle_ttl_ms, 60_000);
        assert_eq!(cfg.cache, None);
        assert_eq!((cfg.locks_max, cfg.locks_grace_ms), (65536, 10_000));
        assert_eq!((cfg.heal, cfg.rebuild_mib_per_s, cfg.heal_interval_ms), (true, 200, 10_000));
        assert_eq!((cfg.stale_ranges_per_slot_max, cfg.stale_entries_max), (64, 1 << 20));
    }

    #[test]
    fn every_field_is_read_and_unknown_ones_are_refused() {
        let text = r#"
            listen = "0.0.0.0:7000"
            rdma_listen = "rdma:10.0.0.1:7001"
            data_dir = "/m"
            key_file = "/m/cluster.key"
            auth = "none"
            liveness_ms = 900
            slots_max = 8
            sessions_max = 16
            gc_interval_ms = 50
            journal_segment_bytes = 1048576
            journal_bytes_max = 8388608
            checkpoint_bytes = 2097152
            checkpoint_interval_ms = 300
            capability_ttl_ms = 2500
            locks_max = 10
            locks_grace_ms = 20
            heal = false
            rebuild_mib_per_s = 0
            heal_interval_ms = 70
            stale_ranges_per_slot_max = 3
            stale_entries_max = 9

            [cache]
            servers = ["127.0.0.1:11211"]
            attrs = false
        "#;
        let cfg: MetaConfig = toml::from_str(text).unwrap();
        assert_eq!(cfg.rdma_listen.as_deref(), Some("rdma:10.0.0.1:7001"));
        assert_eq!((cfg.key_file.clone(), cfg.auth), (Some(PathBuf::from("/m/cluster.key")), AuthMode::None));
        assert_eq!((cfg.liveness_ms, cfg.slots_max, cfg.sessions_max, cfg.gc_interval_ms), (900, 8, 16, 50));
        let journal = cfg.journal();
        assert_eq!((journal.segment_bytes, journal.journal_bytes_max), (1 << 20, 8 << 20));
        assert_eq!((journal.checkpoint_bytes, journal.checkpoint_interval_ms), (2 << 20, 300));
        assert_eq!(cfg.capability_ttl_ms, 2500);
        assert_eq!((cfg.locks_max, cfg.locks_grace_ms), (10, 20));
        assert_eq!((cfg.heal, cfg.rebuild_mib_per_s, cfg.heal_interval_ms), (false, 0, 70));
        assert_eq!((cfg.stale_ranges_per_slot_max, cfg.stale_entries_max), (3, 9));
        let cache = cfg.cache.expect("the [cache] table");
        assert_eq!((cache.servers, cache.attrs, cache.attr_ttl_s), (vec!["127.0.0.1:11211".to_string()], false, 60));
        let unknown = text.replace("[cache]", "unknown = 1\n[cache]");
        assert!(toml::from_str::<MetaConfig>(&unknown).is_err());
        assert!(toml::from_str::<MetaConfig>(&format!("{text}\nunknown = 1\n")).is_err(), "nor in [cache]");
    }
}
