//! How a client finds a cluster: `cluster.toml` (written by `weft up`) or a bare MDS address.
//!
//! ```toml
//! mds = "10.0.0.1:7000"             # or several services of one store: ["10.0.0.1:7000", "10.0.0.2:7000"]
//! key_file = "cluster.key"       # the cluster key (relative: to this file's directory)
//! auth = "key"                   # key (default) | none
//! key_id = "cluster"             # the key's name: "cluster", or a per-client key's (`weft key add NAME`)
//! tls = true                     # run tcp under TLS 1.3 (default false)
//! tls_ca_file = "tls/ca.pem"     # the cluster's CA: servers' certificates must chain to it
//! [client]                       # all optional
//! slots = 16                     # requests in flight per server
//! transfer_unit_bytes = 1048576  # largest payload of one request
//! call_timeout_ms = 30000
//! mds_failover_timeout_ms = 60000 # an unreachable MDS blocks calls this long (trying every address) before EIO
//! fabric = "auto"                # auto | tcp | shm | rdma: how to reach data servers
//! [cache]                        # optional: the memcached bank (weft_cache::CacheConfig), written by
//! servers = ["127.0.0.1:40001"]  # `weft up --cache N`; absent = no bank
//! ```

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use weft_rpc::{AuthMode, ClientConfig, Credential};

use crate::transfer::SizeClasses;

/// How the client reaches data servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FabricChoice {
    /// `shm` to servers on this host (same boot id and a shm listener), `rdma` to others that offer it when this
    /// host has an RDMA device, `tcp` to the rest.
    #[default]
    Auto,
    Tcp,
    /// `shm` only: a server on another host (or without a shm listener) is an error.
    Shm,
    /// `rdma` only (even on the same host): a server without an rdma listener, or a client without a device, is
    /// an error.
    Rdma,
}

impl FabricChoice {
    /// `WEFT_FABRIC` from the environment, else `auto`: the default of every client tuning (so a test run or a
    /// shell can force one fabric for every client it starts without editing cluster files).
    pub fn from_env() -> FabricChoice {
        std::env::var("WEFT_FABRIC").ok().and_then(|v| v.parse().ok()).unwrap_or_default()
    }

    pub fn name(self) -> &'static str {
        match self {
            FabricChoice::Auto => "auto",
            FabricChoice::Tcp => "tcp",
            FabricChoice::Shm => "shm",
            FabricChoice::Rdma => "rdma",
        }
    }
}

impl std::str::FromStr for FabricChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(FabricChoice::Auto),
            "tcp" => Ok(FabricChoice::Tcp),
            "shm" => Ok(FabricChoice::Shm),
            "rdma" => Ok(FabricChoice::Rdma),
            other => Err(format!("unknown fabric {other:?} (auto, tcp, shm or rdma)")),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Address of the metadata service; several (services of one store, e.g. on PostgreSQL, or one service's
    /// successive homes) separated by commas, or as a TOML array: the client moves to the next when one stops
    /// answering.
    #[serde(deserialize_with = "one_or_many_addrs")]
    pub mds: String,
    /// The cluster key this client proves to every server (docs/format.md §9); required with `auth = "key"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    #[serde(default)]
    pub auth: AuthMode,
    /// Which key `key_file` holds: `"cluster"` (the default) for the cluster key, or the name a per-client key
    /// was added under (`weft key add NAME`).
    #[serde(default = "default_key_id")]
    pub key_id: String,
    /// Run every `tcp` connection under TLS 1.3, verifying servers against `tls_ca_file` (`shm` and `rdma` are
    /// unaffected: docs/format.md §11).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
    /// The cluster's CA certificate (PEM); required with `tls = true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca_file: Option<PathBuf>,
    #[serde(default)]
    pub client: ClientTuning,
    /// The cache bank's daemons and what is cached (issue 16); absent in configs written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<weft_cache::CacheConfig>,
}

/// `mds` as a string ("h:p" or "h:p,h2:p2") or an array of strings, kept as one comma-separated string.
fn one_or_many_addrs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let joined = match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => s,
        OneOrMany::Many(v) => v.join(","),
    };
    if joined.split(',').all(|a| a.trim().is_empty()) {
        return Err(serde::de::Error::custom("mds names no address"));
    }
    Ok(joined)
}

fn default_key_id() -> String {
    weft_rpc::auth::CLUSTER_KEY_ID.to_string()
}

/// Default of `mds_failover_timeout_ms`: a minute, time for a restart or for a standby's takeover (NFS's hard
/// mounts wait forever; a minute bounds how long an application hangs on a cluster that is gone).
pub const DEFAULT_MDS_FAILOVER_TIMEOUT_MS: u64 = 60_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientTuning {
    pub slots: u32,
    /// Requests larger than this are split into transfer units sent in parallel (pipelined against the disk).
    pub transfer_unit_bytes: u32,
    pub call_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub attempts_max: u32,
    /// How long a call to the metadata service waits for one of its addresses to answer again (a restart, a
    /// failover to another service) before the application sees EIO, as a hard NFS mount waits; 0: give up after
    /// `attempts_max` attempts.
    pub mds_failover_timeout_ms: u64,
    /// Layouts remembered by inode.
    pub layout_cache_entries: usize,
    /// Benchmarks only: delay before every request is sent (see `weft_rpc::ClientConfig::send_delay_us`).
    pub send_delay_us: u64,
    /// Benchmarks only (Sandia's short circuit): reads and writes stop at the wire, reads returning zeros; shows
    /// the ceiling of the client above the network.
    pub short_circuit_network: bool,
    pub fabric: FabricChoice,
    /// One-sided size classes: inline up to this many bytes…
    pub inline_bytes_max: usize,
    /// …through the pre-registered arena up to this many, zero-copy from the caller's buffer beyond.
    pub buffered_bytes_max: usize,
    /// Arena buffers (each `buffered_bytes_max`), shared by all shm servers: the bound on staged transfers.
    pub arena_buffers: u32,
    /// Pin-down cache entries per data server.
    pub registrations_max: usize,
}

impl Default for ClientTuning {
    fn default() -> Self {
        ClientTuning {
            slots: 16,
            transfer_unit_bytes: 1 << 20,
            call_timeout_ms: 30_000,
            connect_timeout_ms: 5_000,
            attempts_max: 5,
            mds_failover_timeout_ms: DEFAULT_MDS_FAILOVER_TIMEOUT_MS,
            layout_cache_entries: 65_536,
            send_delay_us: 0,
            short_circuit_network: false,
            fabric: FabricChoice::from_env(),
            inline_bytes_max: SizeClasses::default().inline_bytes_max,
            buffered_bytes_max: SizeClasses::default().buffered_bytes_max,
            arena_buffers: 64,
            registrations_max: ClientConfig::default().registrations_max,
        }
    }
}

impl ClientTuning {
    /// The thresholds that choose how a transfer travels on a one-sided fabric.
    pub(crate) fn size_classes(&self) -> SizeClasses {
        SizeClasses { inline_bytes_max: self.inline_bytes_max, buffered_bytes_max: self.buffered_bytes_max }
    }

    pub fn rpc_config(&self) -> ClientConfig {
        let mut c = ClientConfig {
            slots: self.slots.max(1),
            call_timeout_ms: self.call_timeout_ms,
            connect_timeout_ms: self.connect_timeout_ms,
            attempts_max: self.attempts_max.max(1),
            send_delay_us: self.send_delay_us,
            registrations_max: self.registrations_max.max(1),
            ..ClientConfig::default()
        };
        c.limits.data_bytes_max = c.limits.data_bytes_max.max(self.transfer_unit_bytes);
        c
    }
}

impl ClusterConfig {
    /// Reads `spec` as a path to a cluster.toml, or else as MDS addresses (`host:port[,host:port…]`).
    pub fn from_spec(spec: &str) -> Result<ClusterConfig, String> {
        let path = std::path::Path::new(spec);
        if path.is_file() {
            let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {spec}: {e}"))?;
            let mut cfg: ClusterConfig =
                toml::from_str(&text).map_err(|e| format!("{spec} is not a valid cluster file: {e}"))?;
            if let Some(dir) = path.parent() {
                for file in [&mut cfg.key_file, &mut cfg.tls_ca_file] {
                    if let Some(f) = file.as_mut()
                        && f.is_relative()
                    {
                        *f = dir.join(&*f);
                    }
                }
            }
            return Ok(cfg);
        }
        if path.is_dir() && path.join("cluster.toml").is_file() {
            return ClusterConfig::from_spec(&path.join("cluster.toml").to_string_lossy());
        }
        let is_addr =
            |a: &str| a.trim().rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        if spec.split(',').all(is_addr) {
            return Ok(ClusterConfig::new(spec));
        }
        if spec.contains('/') || spec.ends_with(".toml") {
            return Err(format!(
                "{spec}: no such cluster file (is the cluster up? `weft up --data-dir DIR` writes DIR/cluster.toml)"
            ));
        }
        Err(format!("{spec} is neither a cluster file, a directory holding cluster.toml, nor a host:port address"))
    }

    /// A config for the MDS at `mds` with every default (auth = "key", no key file yet).
    pub fn new(mds: &str) -> ClusterConfig {
        ClusterConfig {
            mds: mds.to_string(),
            key_file: None,
            auth: AuthMode::Key,
            key_id: default_key_id(),
            tls: false,
            tls_ca_file: None,
            client: ClientTuning::default(),
            cache: None,
        }
    }

    /// The TLS configuration this config names (`tls = true`), or `None` for plain tcp.
    pub fn tls_config(&self) -> Result<Option<weft_fabric::TlsConfig>, weft_fabric::TlsError> {
        if !self.tls {
            return Ok(None);
        }
        let files = weft_fabric::TlsFiles { ca_file: self.tls_ca_file.clone(), ..Default::default() };
        weft_fabric::TlsConfig::from_files(&files).map(Some)
    }

    /// The credential this config names: the key in `key_file`, under `key_id` (none with `auth = "none"`,
    /// which warns).
    pub fn credential(&self) -> Result<Option<Credential>, String> {
        if self.key_id != weft_rpc::auth::CLUSTER_KEY_ID {
            weft_rpc::keyring::check_client_name(&self.key_id).map_err(|e| format!("key_id: {e}"))?;
        }
        let key = weft_rpc::auth::role_key(self.auth, self.key_file.as_deref(), "client").map_err(|e| e.to_string())?;
        Ok(key.map(|key| Credential { key_id: self.key_id.as_str().into(), key }))
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a cluster config always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(ClusterConfig::from_spec("127.0.0.1:7000").unwrap().mds, "127.0.0.1:7000");
        assert!(ClusterConfig::from_spec("no-such-file").is_err());
        let c: ClusterConfig = toml::from_str("mds = \"h:1\"\n[client]\nslots = 4\n").unwrap();
        assert_eq!(c.client.slots, 4);
        assert_eq!(c.client.transfer_unit_bytes, 1 << 20);
        assert!(toml::from_str::<ClusterConfig>("mds = \"h:1\"\nbogus = 1\n").is_err());
        assert_eq!((c.auth, c.key_file, c.key_id.as_str()), (AuthMode::Key, None, "cluster"));
        let c: ClusterConfig = toml::from_str("mds = \"h:1\"\nkey_id = \"alice\"\n").unwrap();
        assert_eq!(c.key_id, "alice");
        let c = ClusterConfig { key_id: "no/slash".into(), ..c };
        assert!(c.credential().unwrap_err().contains("key_id"));
        let c: ClusterConfig = toml::from_str("mds = \"h:1\"\nkey_file = \"/k\"\nauth = \"none\"\n").unwrap();
        assert_eq!((c.auth, c.key_file.as_deref()), (AuthMode::None, Some(std::path::Path::new("/k"))));
        assert!(c.to_toml().contains("key_file = \"/k\"\nauth = \"none\""), "{}", c.to_toml());
    }

    #[test]
    fn mds_names_one_address_or_several() {
        let c: ClusterConfig = toml::from_str("mds = [\"a:1\", \"b:2\"]\n").unwrap();
        assert_eq!(c.mds, "a:1,b:2");
        let back: ClusterConfig = toml::from_str(&c.to_toml()).unwrap();
        assert_eq!(back.mds, "a:1,b:2");
        assert_eq!(
            ClusterConfig::from_spec("127.0.0.1:7000,127.0.0.1:7001").unwrap().mds,
            "127.0.0.1:7000,127.0.0.1:7001"
        );
        assert!(toml::from_str::<ClusterConfig>("mds = []\n").is_err());
        assert!(toml::from_str::<ClusterConfig>("mds = \" , \"\n").is_err());
        let t = ClientTuning::default();
        assert_eq!((t.mds_failover_timeout_ms, t.rpc_config().failover_timeout_ms), (60_000, 0));
    }

    #[test]
    fn the_cache_section_is_optional() {
        // A config written before the bank existed has none, and writing it back adds none.
        let old: ClusterConfig = toml::from_str("mds = \"h:1\"\n[client]\nslots = 4\n").unwrap();
        assert!(old.cache.is_none());
        assert!(!old.to_toml().contains("[cache]"), "{}", old.to_toml());
        let c: ClusterConfig =
            toml::from_str("mds = \"h:1\"\n[cache]\nservers = [\"127.0.0.1:5\"]\nblock_bytes = 256\n").unwrap();
        let cache = c.cache.as_ref().unwrap();
        assert_eq!((cache.servers.as_slice(), cache.block_bytes), (&["127.0.0.1:5".to_string()][..], 256));
        let back: ClusterConfig = toml::from_str(&c.to_toml()).unwrap();
        assert_eq!(back.cache, c.cache);
    }
}
