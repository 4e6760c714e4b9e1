//! The stores the store-agnostic unit tests run on: [`TestStore::fresh`] gives an empty one, and
//! `on_every_store!(test_a, test_b)` instantiates generic test functions `fn test_a<S: TestStore>()` as
//! `mem::test_a` (on `MemStore`) and `pg::test_a` (on `PgStore`, a database of its own on the test process's
//! PostgreSQL server, [`crate::pg_testing`]).

use crate::{MemStore, MetaStore};

/// A store the store-agnostic tests run on, each test on a fresh, empty one: `MemStore`, and `PgStore` on a
/// database of its own on the test process's PostgreSQL server (`crate::pg_testing`).
pub(crate) trait TestStore: MetaStore + Sized {
    fn fresh() -> Self;
    /// Whether an aborted transaction's inode numbers are handed out again (a counter inside the transaction) or
    /// skipped (a PostgreSQL sequence: never reused either way).
    const REUSES_ABORTED_INOS: bool = true;
}

impl TestStore for MemStore {
    fn fresh() -> Self {
        MemStore::new()
    }
}

impl TestStore for crate::PgStore {
    fn fresh() -> Self {
        crate::pg_testing::fresh_store()
    }
    const REUSES_ABORTED_INOS: bool = false;
}

/// Instantiates store-generic tests once per store: `mem::NAME` on `MemStore`, `pg::NAME` on `PgStore`.
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod mem {
            $(#[test]
            fn $name() {
                super::$name::<crate::MemStore>()
            })*
        }
        mod pg {
            $(#[test]
            fn $name() {
                super::$name::<crate::PgStore>()
            })*
        }
    };
}

pub(crate) use on_every_store;
