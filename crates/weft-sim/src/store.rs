//! The metadata store as one simulated service reaches it: the one store all services share (as services share
//! a PostgreSQL database), through faults of that service's own. The seam is the `MetaStore` trait itself.
//!
//! Faults: the service cut off from the database (every transaction fails, nothing applied), and a flaky
//! connection (a transaction fails before its commit, nothing applied; or its commit applies and the answer is
//! lost, `MetaError::CommitUnknown`, as when PostgreSQL's primary fails over mid-`COMMIT`).

use std::sync::{Arc, Mutex};

use weft_meta::{MemStore, MetaError, MetaStore, MetaTxn};

use crate::Rng;

/// One service's handle on the shared store.
#[derive(Clone)]
pub struct SimStore {
    pub inner: Arc<MemStore>,
    pub faults: Arc<Mutex<StoreFaults>>,
}

/// The faults of one service's connection, set by the simulation.
#[derive(Debug)]
pub struct StoreFaults {
    /// Cut off: every transaction fails, nothing applied.
    pub cut: bool,
    /// Per mille of transactions that fail before commit, and (independently) of writes whose commit applies but
    /// reports failure.
    pub flaky: u64,
    rng: Rng,
}

impl StoreFaults {
    pub fn new(seed: u64) -> StoreFaults {
        StoreFaults { cut: false, flaky: 0, rng: Rng::new(seed) }
    }

    pub fn heal(&mut self) {
        (self.cut, self.flaky) = (false, 0);
    }
}

impl SimStore {
    /// A handle on `inner` with faults of its own (none yet).
    pub fn new(inner: Arc<MemStore>, seed: u64) -> SimStore {
        SimStore { inner, faults: Arc::new(Mutex::new(StoreFaults::new(seed))) }
    }

    /// (fail before the commit, lose the commit's answer) for the next transaction.
    fn roll(&self) -> (bool, bool) {
        let mut f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        let flaky = f.flaky;
        let before = f.cut || (flaky > 0 && f.rng.chance(flaky));
        let after = flaky > 0 && f.rng.chance(flaky);
        (before, after)
    }
}

fn lost() -> MetaError {
    MetaError::Store("simulated: connection to the database lost".into())
}

impl MetaStore for SimStore {
    fn write<R, E: From<MetaError>>(&self, f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        let (before, after) = self.roll();
        if before {
            return Err(lost().into());
        }
        let r = self.inner.write(f)?;
        if after {
            return Err(MetaError::CommitUnknown("simulated: connection lost during COMMIT".into()).into());
        }
        Ok(r)
    }

    fn read<R, E: From<MetaError>>(&self, f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        if self.roll().0 {
            return Err(lost().into());
        }
        self.inner.read(f)
    }

    fn shared(&self) -> bool {
        true
    }
}
