//! Time as the namespace sees it, behind a trait so tests control it.
//!
//! Two clocks because they answer different questions: file timestamps need wall-clock nanoseconds since the Unix
//! epoch (which can jump), while data server liveness needs a monotonic age that never goes backwards.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync + 'static {
    /// Wall-clock time in nanoseconds since the Unix epoch (negative before it).
    fn now_ns(&self) -> i64;
    /// Monotonic milliseconds since an arbitrary fixed origin.
    fn mono_ms(&self) -> u64;
}

/// The operating system's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> i64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
            Err(e) => i64::try_from(e.duration().as_nanos()).map(|n| -n).unwrap_or(i64::MIN),
        }
    }

    fn mono_ms(&self) -> u64 {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        let origin = *ORIGIN.get_or_init(Instant::now);
        u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A clock that only moves when told to, for deterministic tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ns: AtomicI64,
    mono_ms: AtomicU64,
}

impl ManualClock {
    pub fn new(now_ns: i64) -> Self {
        ManualClock { now_ns: AtomicI64::new(now_ns), mono_ms: AtomicU64::new(0) }
    }

    pub fn set_ns(&self, now_ns: i64) {
        self.now_ns.store(now_ns, Ordering::SeqCst);
    }

    /// Moves both clocks forward by `ms` milliseconds.
    pub fn advance_ms(&self, ms: u64) {
        self.mono_ms.fetch_add(ms, Ordering::SeqCst);
        let ns = i64::try_from(ms.saturating_mul(1_000_000)).unwrap_or(i64::MAX);
        let _ = self.now_ns.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| Some(v.saturating_add(ns)));
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> i64 {
        self.now_ns.load(Ordering::SeqCst)
    }

    fn mono_ms(&self) -> u64 {
        self.mono_ms.load(Ordering::SeqCst)
    }
}

impl<C: Clock> Clock for std::sync::Arc<C> {
    fn now_ns(&self) -> i64 {
        (**self).now_ns()
    }

    fn mono_ms(&self) -> u64 {
        (**self).mono_ms()
    }
}
