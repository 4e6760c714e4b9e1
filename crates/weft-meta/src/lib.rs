//! The Weft metadata service's core: the namespace (inodes, directory entries, attributes, layouts, the data
//! server registry) and the transactional store it lives in.
//!
//! Why this split: [`Namespace`] holds every POSIX-like rule once, written against the [`MetaTxn`] trait, and
//! checks each op's permissions for a [`Cred`] with the pure rules of [`perm`];
//! [`MetaStore`] implementations only provide atomic, durable transactions over a few keyed tables. The embedded
//! default is [`RedbStore`] (one crash-safe file); [`PgStore`] keeps it in a PostgreSQL database several services
//! can share ([`MdsStore`] is the one a service runs); [`MemStore`] makes the rules testable without a disk. This
//! core is synchronous and does no networking of its own (`PgStore` talks to its database): the service wraps
//! [`Namespace::execute`] in its RPC handler and runs it on a blocking thread, because each write transaction waits
//! for an fsync (or a database commit).
//!
//! The process around it: [`config`] (`weft meta --config F` and its defaults), [`service`] (the RPC service),
//! [`node`] (store, listeners, service), `gc` (deletes removed files' objects from the data servers) and `push`
//! (publishes changed attributes and lookups to the cache bank); [`locks`] (the advisory lock table) and
//! [`lock_sessions`] (its permission checks and the release of a vanished client's locks).

pub mod acl;
pub mod clock;
pub mod config;
pub mod copy;
pub mod db_locks;
mod drain;
pub mod duty;
pub mod error;
mod gc;
pub mod journal;
mod lease_service;
pub mod leases;
pub mod lock_sessions;
pub mod locks;
pub mod mds_store;
pub mod mem_store;
pub mod membership;
pub mod namespace;
pub mod node;
pub mod once;
pub mod perm;
pub mod pg_bin;
pub mod pg_store;
#[cfg(test)]
pub(crate) mod pg_testing;
mod push;
pub mod redb_store;
pub mod service;
pub mod stale;
pub mod store;
#[cfg(test)]
mod test_stores;
pub mod touched;

pub use acl::{Acl, AclError};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::MetaConfig;
pub use error::MetaError;
pub use journal::JournalConfig;
pub use mds_store::{MdsNamespace, MdsStore};
pub use mem_store::MemStore;
pub use namespace::{DEFAULT_LIVENESS_MS, Namespace};
pub use node::{DutyFlag, MetaServerError, run, run_with};
pub use perm::{Cred, Mask, PermError};
pub use pg_store::{PgConfig, PgStats, PgStore};
pub use redb_store::RedbStore;
pub use service::{HealHooks, MetaService};
pub use store::{Inode, MetaStore, MetaTxn};
