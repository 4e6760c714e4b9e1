//! `MdsStore`: the store a metadata service runs on, chosen when it starts: the embedded [`RedbStore`] in its
//! `data_dir` (the default), or a [`PgStore`] that several services may share (`db = "postgres://…"`).
//!
//! Why an enum and not a generic service: the service, its background tasks and the cache-bank pusher all hold
//! one namespace type; two stores behind one `match` keep them written once, and the namespace rules are still
//! compiled against [`MetaTxn`] only.

use crate::error::MetaError;
use crate::store::{MetaStore, MetaTxn};
use crate::{Namespace, PgStore, RedbStore, SystemClock};

/// The namespace a metadata service serves.
pub type MdsNamespace = Namespace<MdsStore, SystemClock>;

/// Either store.
#[derive(Debug)]
pub enum MdsStore {
    Redb(RedbStore),
    /// Boxed: the pool and its runtime are large beside a `RedbStore` handle.
    Pg(Box<PgStore>),
}

impl MetaStore for MdsStore {
    fn write<R, E: From<MetaError>>(&self, f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        match self {
            MdsStore::Redb(s) => s.write(f),
            MdsStore::Pg(s) => s.write(f),
        }
    }

    fn read<R, E: From<MetaError>>(&self, f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        match self {
            MdsStore::Redb(s) => s.read(f),
            MdsStore::Pg(s) => s.read(f),
        }
    }

    fn shared(&self) -> bool {
        matches!(self, MdsStore::Pg(_))
    }
}
