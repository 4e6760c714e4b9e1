//! The `[cache]` table of `cluster.toml` (and, later, of the MDS and data-server configs).
//!
//! ```toml
//! [cache]
//! servers = ["127.0.0.1:40001", "127.0.0.1:40002"]   # memcached daemons (host:port)
//! namespace = 12345                # in every key: clusters sharing daemons never collide (0 ..= 2^63 − 1)
//! key_generation = 0               # which bank key seals the items (raise it everywhere to rotate the key)
//! block_bytes = 8192               # data block size (the papers measured 256, 2048 and 8192)
//! attrs = true                     # cache attributes and lookups
//! attr_miss_streak_max = 8         # a client whose stats miss this many times in a row pauses its lookups…
//! attr_miss_skip_max = 64          # …for 1, 2, 4… up to this many calls between probes (0 above: never pause)
//! lookup_guesses_max = 4096       # names a client remembers the inode of (one-round-trip lookups)
//! attr_ttl_s = 60                  # attribute and lookup items expire after this (NFS acregmax)
//! data = true                      # cache data blocks
//! data_read_blocks_max = 16        # a read touching more blocks goes straight to the data servers, no fills
//! data_miss_streak_max = 4         # an open file whose reads miss this many times in a row pauses its lookups…
//! data_miss_skip_reads_max = 64    # …for 1, 2, 4… up to this many reads between probes (0 above: never pause)
//! request_timeout_ms = 50          # deadline of one bank request; past it, a miss
//! connect_timeout_ms = 50
//! inflight_max = 256               # bank requests in flight at once, all daemons
//! connections_per_daemon = 8       # idle connections kept per daemon
//! errors_to_eject = 3              # consecutive failures that take a daemon out…
//! eject_ms = 2000                  # …for this long, then one probe
//! points_per_daemon = 160          # virtual nodes on the ring
//! ```

use serde::{Deserialize, Serialize};

use crate::value::PAYLOAD_BYTES_MAX;

/// The most blocks one read may look up (`data_read_blocks_max`'s ceiling): one multi-get's keys.
pub const DATA_READ_BLOCKS_MAX: u32 = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    pub servers: Vec<String>,
    pub namespace: u64,
    /// Which bank key seals the items: the key is derived from the cluster key and this number
    /// ([`crate::BankKey::for_cluster`]), so raising it in every role's config (`weft key rotate --bank`) rotates
    /// the key; items sealed under another generation are misses.
    pub key_generation: u32,
    pub block_bytes: u32,
    /// Cache attributes and lookups: the MDS pushes them on every change, clients look there before the MDS.
    pub attrs: bool,
    pub data: bool,
    /// A read touching more data blocks than this (1 ..= 4096) neither looks them up nor asks for fills: it goes
    /// straight to the data servers. The bank pays for small reads; for large ones a multi-get of many keys, and
    /// as many fills, cost more than the transfer they could save.
    pub data_read_blocks_max: u32,
    /// After this many reads of one open file in a row found none of their blocks, the file's reads stop looking
    /// in the bank for a while (they still ask the data servers to fill it): misses then cost nothing. 0: never.
    pub data_miss_streak_max: u32,
    /// The longest such pause, in reads (each missed probe doubles it, from 1).
    pub data_miss_skip_reads_max: u32,
    /// After this many `getattr`/`lookup` calls of one client in a row found nothing usable in the bank, its
    /// next calls go straight to the MDS for a while (1, 2, 4… calls between probes): misses then cost nothing.
    /// 0: never pause.
    pub attr_miss_streak_max: u32,
    /// The longest such pause, in calls.
    pub attr_miss_skip_max: u32,
    /// Names (directory, name) whose inode a client remembers from its last lookup, so that its next lookup of
    /// the name fetches the entry and that inode's attributes in one multi-get (0: two round trips always).
    pub lookup_guesses_max: u32,
    /// Attribute and lookup items expire this many seconds after they were stored (as NFS's `acregmax`): the bound
    /// on how stale one can be when both the MDS's push and its fallback delete were lost with a daemon. 0: never.
    pub attr_ttl_s: u32,
    pub request_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub inflight_max: usize,
    pub connections_per_daemon: usize,
    pub errors_to_eject: u32,
    pub eject_ms: u64,
    pub points_per_daemon: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            servers: Vec::new(),
            namespace: 0,
            key_generation: 0,
            block_bytes: 8192,
            attrs: true,
            data: true,
            data_read_blocks_max: 16,
            data_miss_streak_max: 4,
            data_miss_skip_reads_max: 64,
            attr_miss_streak_max: 8,
            attr_miss_skip_max: 64,
            lookup_guesses_max: 4096,
            attr_ttl_s: 60,
            request_timeout_ms: 50,
            connect_timeout_ms: 50,
            inflight_max: 256,
            connections_per_daemon: 8,
            errors_to_eject: 3,
            eject_ms: 2000,
            points_per_daemon: crate::ring::POINTS_PER_DAEMON_DEFAULT,
        }
    }
}

/// A cache config that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("cache block_bytes {0} must be between 1 and {PAYLOAD_BYTES_MAX} (memcached's 1 MiB item limit)")]
    BlockBytes(u32),
    #[error("cache server {0:?} is not host:port")]
    Server(String),
    #[error("cache data_read_blocks_max {0} must be between 1 and {DATA_READ_BLOCKS_MAX}")]
    ReadBlocks(u32),
    #[error("cache inflight_max must be at least 1")]
    Inflight,
    #[error("cache namespace {0} is above 2^63 - 1 (TOML integers are signed)")]
    Namespace(u64),
}

impl CacheConfig {
    /// Whether anything is cached at all.
    pub fn enabled(&self) -> bool {
        !self.servers.is_empty() && (self.attrs || self.data)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.block_bytes == 0 || self.block_bytes as usize > PAYLOAD_BYTES_MAX {
            return Err(ConfigError::BlockBytes(self.block_bytes));
        }
        for s in &self.servers {
            let ok = s.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(ConfigError::Server(s.clone()));
            }
        }
        if self.data_read_blocks_max == 0 || self.data_read_blocks_max > DATA_READ_BLOCKS_MAX {
            return Err(ConfigError::ReadBlocks(self.data_read_blocks_max));
        }
        if self.inflight_max == 0 {
            return Err(ConfigError::Inflight);
        }
        if i64::try_from(self.namespace).is_err() {
            return Err(ConfigError::Namespace(self.namespace));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_defaults() {
        let c: CacheConfig = toml::from_str("servers = [\"127.0.0.1:11211\"]\nblock_bytes = 2048\n").unwrap();
        assert_eq!(c.servers, vec!["127.0.0.1:11211"]);
        assert_eq!(c.block_bytes, 2048);
        assert_eq!(c.request_timeout_ms, CacheConfig::default().request_timeout_ms);
        assert!(c.enabled());
        c.validate().unwrap();
        let empty: CacheConfig = toml::from_str("").unwrap();
        assert_eq!(empty, CacheConfig::default());
        assert!(!empty.enabled());
        // What a config writes, it reads back.
        assert_eq!(toml::from_str::<CacheConfig>(&toml::to_string(&c).unwrap()).unwrap(), c);
    }

    #[test]
    fn refuses_what_cannot_work() {
        assert!(toml::from_str::<CacheConfig>("sever = []").is_err(), "a misspelt key is refused");
        let big = CacheConfig { block_bytes: 1 << 20, ..CacheConfig::default() };
        assert_eq!(big.validate(), Err(ConfigError::BlockBytes(1 << 20)));
        let zero = CacheConfig { block_bytes: 0, ..CacheConfig::default() };
        assert!(zero.validate().is_err());
        let bad = CacheConfig { servers: vec!["localhost".into()], ..CacheConfig::default() };
        assert_eq!(bad.validate(), Err(ConfigError::Server("localhost".into())));
        for blocks in [0, DATA_READ_BLOCKS_MAX + 1] {
            let c = CacheConfig { data_read_blocks_max: blocks, ..CacheConfig::default() };
            assert_eq!(c.validate(), Err(ConfigError::ReadBlocks(blocks)));
        }
        let none = CacheConfig { inflight_max: 0, ..CacheConfig::default() };
        assert_eq!(none.validate(), Err(ConfigError::Inflight));
        let wide = CacheConfig { namespace: u64::MAX, ..CacheConfig::default() };
        assert_eq!(wide.validate(), Err(ConfigError::Namespace(u64::MAX)));
        let widest = CacheConfig { namespace: i64::MAX as u64, ..CacheConfig::default() };
        assert!(toml::to_string(&widest).is_ok() && widest.validate().is_ok());
    }
}
