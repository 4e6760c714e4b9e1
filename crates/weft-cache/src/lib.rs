//! Weft's cache bank (issue 16, after IMCa): memcached daemons between clients and servers.
//!
//! Keys are placed on daemons by consistent hashing ([`ring`]); a daemon that stops answering is ejected for a
//! while and retried ([`health`]); every value is sealed under the bank key with its memcached key as associated
//! data ([`seal`], [`value`], docs/format.md §12), so what a daemon returns is data only when the seal opens, and
//! a bystander who reaches a daemon can neither read an item nor forge one. The [`Bank`] never
//! fails a caller: a miss, a timeout or a dead daemon is `None`, and the caller asks the server that owns the
//! data. Keys carry the version of what they hold (a file's data version), so an item is never overwritten with
//! other contents and a stale one is simply never asked for. Attributes and lookups ([`attrs`]) cannot carry a
//! version a client knows in advance: the MDS overwrites them after every change, and they expire.

pub mod attrs;
pub mod bank;
pub mod config;
pub mod health;
pub mod miss;
pub mod ring;
pub mod seal;
pub mod value;

pub use bank::{Bank, BankStats};
pub use config::{CacheConfig, ConfigError};
pub use health::HealthState;
pub use miss::MissHint;
pub use seal::BankKey;
pub use value::{AttrItem, CacheKey, ItemKind, LookupItem};
