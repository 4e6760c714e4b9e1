//! Tests' hooks inside the ec write and heal paths: how a test loses a server, moves a row or reads a row at
//! exactly one moment of a write. Each [`Client`](crate::Client) has its own (its clones share them), so tests in
//! one process, each with its own clients, never fire each other's hooks. Empty in production: an unset hook is
//! one uncontended lock per delta write, degraded write or heal batch.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// A hook's future.
pub type HookFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Run by every delta write between its reads and its writes, with the row.
pub type DeltaHook = Arc<dyn Fn(u64) -> HookFuture + Send + Sync>;
/// Run by every batch heal between its reads and its writes, with the batch's first row.
pub type HealHook = Arc<dyn Fn(u64) -> HookFuture + Send + Sync>;
/// Run by a degraded row write between its writes and its marking what it missed stale, with the file's inode
/// and the job's first row.
pub type DegradedHook = Arc<dyn Fn(u64, u64) -> HookFuture + Send + Sync>;

/// One client's hooks (`Client::test_hooks`).
#[derive(Default)]
pub struct TestHooks {
    delta: Mutex<Option<DeltaHook>>,
    heal: Mutex<Option<HealHook>>,
    degraded: Mutex<Option<DegradedHook>>,
}

fn get<T: Clone>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

fn set<T>(slot: &Mutex<Option<T>>, hook: Option<T>) {
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = hook;
}

impl TestHooks {
    /// Installs (or with `None` removes) the delta write hook.
    pub fn set_delta(&self, hook: Option<DeltaHook>) {
        set(&self.delta, hook);
    }

    /// Installs (or with `None` removes) the batch heal hook.
    pub fn set_heal(&self, hook: Option<HealHook>) {
        set(&self.heal, hook);
    }

    /// Installs (or with `None` removes) the degraded write hook.
    pub fn set_degraded(&self, hook: Option<DegradedHook>) {
        set(&self.degraded, hook);
    }

    pub(crate) fn delta(&self) -> Option<DeltaHook> {
        get(&self.delta)
    }

    pub(crate) fn heal(&self) -> Option<HealHook> {
        get(&self.heal)
    }

    pub(crate) fn degraded(&self) -> Option<DegradedHook> {
        get(&self.degraded)
    }
}
