//! The healer: catches data servers up on the rows of redundant files they missed (docs/format.md §18).
//!
//! `weft meta` runs one beside the MDS (`heal = true` in its config), connected with the cluster key as the
//! trusted service. A *pass* lists the stale table (`ListStale`, page by page) and, for each (file, slot) whose
//! server is up, rebuilds each stale range's rows from the other chunks ([`weft_client::heal_rows`]: ec decode, or
//! another mirror copy), writes them to that server, and clears exactly what it healed (`ClearStale` with the
//! range's seq, batch by batch from the front). A range marked again meanwhile has a new seq: the clear changes
//! nothing and the next pass heals it again. A whole slot (`[0, u64::MAX)`, a server replaced by a spare) is the
//! same code over every row of the file, so a rebuild onto a spare is a catch-up.
//!
//! Bounded: at most `concurrency` entries are healed at once, each one batch (at most `batch_bytes_max` of
//! chunks read) at a time; throughput is held under `rebuild_mib_per_s` (0: unthrottled). A pass that failed
//! (a server still unreachable, an MDS error) is retried after a backoff doubling from `retry_first_ms` up to
//! `retry_max_ms`; an idle healer wakes every `interval_ms`, or at once on `HealNow` (`weft heal --now`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use weft_client::{Client, ClientError, OpenMode};
use weft_proto::msg::{ClearStaleReq, HealProgress, StaleEntry};
use weft_proto::{DataRedundancy, ErrorCode, Layout, ServerState};

/// The healer's settings (from the MDS config).
#[derive(Debug, Clone)]
pub struct HealConfig {
    /// Most MiB per second of chunks written; 0: unthrottled.
    pub rebuild_mib_per_s: u64,
    /// An idle healer looks for work this often.
    pub interval_ms: u64,
    /// (file, slot) entries healed at once.
    pub concurrency: usize,
    /// Most bytes of chunks one batch reads (`rows × unit × width`): the memory one entry's heal holds.
    pub batch_bytes_max: u64,
    pub retry_first_ms: u64,
    pub retry_max_ms: u64,
}

impl Default for HealConfig {
    fn default() -> Self {
        HealConfig {
            rebuild_mib_per_s: 200,
            interval_ms: 10_000,
            concurrency: 4,
            batch_bytes_max: 16 << 20,
            retry_first_ms: 500,
            retry_max_ms: 30_000,
        }
    }
}

/// What the healer shares with the MDS in its process: the nudge `HealNow` pulls and the progress `ListStale`
/// reports.
#[derive(Default)]
pub struct HealState {
    nudge: Notify,
    bytes_left: AtomicU64,
    bytes_healed: AtomicU64,
    rate_bytes_per_s: AtomicU64,
    ranges_healed: AtomicU64,
}

impl HealState {
    pub fn new() -> Arc<HealState> {
        Arc::new(HealState::default())
    }

    /// Wakes the healer now.
    pub fn nudge(&self) {
        self.nudge.notify_one();
    }

    pub fn progress(&self) -> HealProgress {
        HealProgress {
            running: true,
            bytes_left: self.bytes_left.load(Ordering::Relaxed),
            bytes_healed: self.bytes_healed.load(Ordering::Relaxed),
            rate_bytes_per_s: self.rate_bytes_per_s.load(Ordering::Relaxed),
            ranges_healed: self.ranges_healed.load(Ordering::Relaxed),
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    /// Bytes of chunks written.
    pub bytes: u64,
    /// Stale ranges (or parts) cleared.
    pub cleared: u64,
    /// Entries left for later: their server is down, or healing them failed.
    pub pending: u64,
    /// Entries whose heal failed (retried after a backoff).
    pub failed: u64,
}

pub struct Healer {
    client: Client,
    cfg: HealConfig,
    state: Arc<HealState>,
}

/// A pass-wide throttle: bytes written since `started`, held under `bytes_per_s` (0: unthrottled).
struct Throttle {
    bytes_per_s: u64,
    started: Instant,
    bytes: AtomicU64,
}

impl Throttle {
    fn new(bytes_per_s: u64) -> Throttle {
        Throttle { bytes_per_s, started: Instant::now(), bytes: AtomicU64::new(0) }
    }

    /// Accounts `n` bytes and waits until the pass is back under its rate.
    async fn take(&self, n: u64) {
        let total = self.bytes.fetch_add(n, Ordering::Relaxed) + n;
        if self.bytes_per_s == 0 {
            return;
        }
        let due = Duration::from_secs_f64(total as f64 / self.bytes_per_s as f64);
        let elapsed = self.started.elapsed();
        if due > elapsed {
            tokio::time::sleep(due - elapsed).await;
        }
    }
}

/// Rows of `layout` that hold bytes of a file of `size` bytes.
fn rows_in_file(layout: &Layout, size: u64) -> u64 {
    size.div_ceil(row_bytes(layout))
}

fn row_bytes(layout: &Layout) -> u64 {
    let unit = u64::from(layout.stripe_unit);
    match layout.redundancy {
        DataRedundancy::Ec { k, .. } => unit * u64::from(k),
        _ => unit,
    }
}

impl Healer {
    /// A healer acting through `client` (connected with the cluster key, as root), sharing `state` with the MDS.
    pub fn new(client: Client, cfg: HealConfig, state: Arc<HealState>) -> Healer {
        Healer { client, cfg, state }
    }

    /// Heals forever: a pass, then waits for the interval, a nudge, or (after a failed pass) a backoff.
    pub async fn run(self) {
        let mut backoff_ms = self.cfg.retry_first_ms.max(1);
        loop {
            let wait_ms = match self.pass().await {
                Ok(r) => {
                    if r.bytes > 0 || r.cleared > 0 {
                        tracing::info!(bytes = r.bytes, cleared = r.cleared, pending = r.pending, "heal pass done");
                    }
                    if r.failed > 0 {
                        let w = backoff_ms;
                        backoff_ms = (backoff_ms * 2).min(self.cfg.retry_max_ms.max(1));
                        w
                    } else {
                        backoff_ms = self.cfg.retry_first_ms.max(1);
                        self.cfg.interval_ms
                    }
                }
                Err(e) => {
                    tracing::warn!("heal pass failed: {e}");
                    let w = backoff_ms;
                    backoff_ms = (backoff_ms * 2).min(self.cfg.retry_max_ms.max(1));
                    w
                }
            };
            tokio::select! {
                _ = self.state.nudge.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
            }
        }
    }

    /// One pass over the whole stale table.
    pub async fn pass(&self) -> Result<PassReport, ClientError> {
        let throttle = Arc::new(Throttle::new(self.cfg.rebuild_mib_per_s.saturating_mul(1 << 20)));
        let me = Arc::new(HealerRef { client: self.client.clone(), cfg: self.cfg.clone() });
        let started = Instant::now();
        let up: Vec<u32> = self
            .client
            .cluster_info()
            .await?
            .into_iter()
            .filter(|s| s.state == ServerState::Up)
            .map(|s| s.id)
            .collect();
        let mut report = PassReport::default();
        let mut after = None;
        loop {
            let page = self.client.list_stale(None, after, 0).await?;
            after = page.entries.last().map(|e| (e.ino, e.slot));
            self.estimate(&page.entries).await;
            let mut tasks = tokio::task::JoinSet::new();
            for e in page.entries {
                while tasks.len() >= self.cfg.concurrency.max(1) {
                    collect(&mut report, tasks.join_next().await, &self.state);
                }
                let (me, throttle, up) = (me.clone(), throttle.clone(), up.clone());
                tasks.spawn(async move { me.heal_entry(&e, &up, &throttle).await });
            }
            while let Some(r) = tasks.join_next().await {
                collect(&mut report, Some(r), &self.state);
            }
            if !page.more || after.is_none() {
                break;
            }
        }
        let secs = started.elapsed().as_secs_f64();
        let rate = if secs > 0.0 && report.bytes > 0 { (report.bytes as f64 / secs) as u64 } else { 0 };
        self.state.rate_bytes_per_s.store(rate, Ordering::Relaxed);
        if report.pending == 0 {
            self.state.bytes_left.store(0, Ordering::Relaxed);
        }
        Ok(report)
    }

    /// Bytes of chunks the listed entries still need (for `weft heal` and `weft status`'s ETA).
    async fn estimate(&self, entries: &[StaleEntry]) {
        let mut left = 0u64;
        for e in entries {
            let Ok(attr) = self.client.getattr(e.ino).await else { continue };
            let Some(layout) = attr.layout else { continue };
            let rows = rows_in_file(&layout, attr.size);
            for r in &e.ranges {
                left += r.end.min(rows).saturating_sub(r.start) * u64::from(layout.stripe_unit);
            }
        }
        self.state.bytes_left.store(left, Ordering::Relaxed);
    }
}

/// The outcome of one entry's heal: bytes written, ranges cleared, whether it is still pending, whether it failed.
type EntryOutcome = (u64, u64, bool, bool);

fn collect(report: &mut PassReport, r: Option<Result<EntryOutcome, tokio::task::JoinError>>, state: &HealState) {
    match r {
        Some(Ok((bytes, cleared, pending, failed))) => {
            report.bytes += bytes;
            report.cleared += cleared;
            report.pending += u64::from(pending);
            report.failed += u64::from(failed);
            state.bytes_healed.fetch_add(bytes, Ordering::Relaxed);
            state.ranges_healed.fetch_add(cleared, Ordering::Relaxed);
            let _ =
                state.bytes_left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| Some(l.saturating_sub(bytes)));
        }
        Some(Err(e)) => {
            tracing::warn!("heal task failed: {e}");
            report.failed += 1;
        }
        None => {}
    }
}

/// What a spawned entry heal needs.
struct HealerRef {
    client: Client,
    cfg: HealConfig,
}

impl HealerRef {
    async fn heal_entry(&self, e: &StaleEntry, up: &[u32], throttle: &Throttle) -> EntryOutcome {
        match self.try_heal_entry(e, up, throttle).await {
            Ok(o) => o,
            Err(err) => {
                tracing::warn!(ino = e.ino, slot = e.slot, "healing failed (retried later): {err}");
                (0, 0, true, true)
            }
        }
    }

    async fn try_heal_entry(
        &self,
        e: &StaleEntry,
        up: &[u32],
        throttle: &Throttle,
    ) -> Result<EntryOutcome, ClientError> {
        let file = match self.client.open_ino(e.ino, OpenMode::ReadWrite).await {
            Ok(f) => f,
            Err(err) if err.code() == Some(ErrorCode::NotFound) => {
                // The file is gone: nothing to heal; its entry goes.
                let mut cleared = 0;
                for r in &e.ranges {
                    let req = ClearStaleReq { ino: e.ino, slot: e.slot, start: r.start, end: r.end, seq: r.seq };
                    cleared += u64::from(self.client.clear_stale(req).await?);
                }
                return Ok((0, cleared, false, false));
            }
            Err(err) => return Err(err),
        };
        let layout = file.layout().clone();
        let slot = e.slot as usize;
        let Some(&server) = layout.servers.get(slot) else {
            return Err(ClientError::Protocol(format!("inode {}: stale slot {slot} is not in its layout", e.ino)));
        };
        if !up.contains(&server) {
            tracing::debug!(ino = e.ino, slot, server, "stale slot's server is down: healed when it is back");
            return Ok((0, 0, true, false));
        }
        let width = layout.servers.len() as u64;
        let unit = u64::from(layout.stripe_unit);
        let batch_rows = (self.cfg.batch_bytes_max / (unit * width).max(1)).max(1);
        let size = file.size();
        let rows = rows_in_file(&layout, size);
        let (mut bytes, mut cleared) = (0u64, 0u64);
        'ranges: for r in &e.ranges {
            let mut at = r.start;
            // A whole slot ends with the file. A marked range is healed whole, even past the committed size: a
            // degraded write's rows are there until its writer commits, and its bytes are on the other servers.
            let (stop, cut) = if r.end == u64::MAX {
                (rows.max(r.start), size)
            } else {
                (r.end, size.max(r.end.saturating_mul(row_bytes(&layout))))
            };
            while at < stop {
                let n = batch_rows.min(stop - at);
                let written = weft_client::heal_rows(&file, slot, at, n, cut).await?;
                throttle.take(written).await;
                bytes += written;
                let req = ClearStaleReq { ino: e.ino, slot: e.slot, start: at, end: at + n, seq: r.seq };
                if !self.client.clear_stale(req).await? {
                    // Marked again while we copied: the next pass heals it under its new seq.
                    tracing::info!(ino = e.ino, slot, server, row = at, "stale range marked again during its heal");
                    continue 'ranges;
                }
                at += n;
            }
            // A whole slot's rows past the file's end hold nothing: its tail goes without copying.
            if at < r.end {
                let req = ClearStaleReq { ino: e.ino, slot: e.slot, start: at, end: r.end, seq: r.seq };
                if !self.client.clear_stale(req).await? {
                    continue 'ranges;
                }
            }
            cleared += 1;
            tracing::info!(ino = e.ino, slot, server, start = r.start, end = r.end, "healed a stale range");
        }
        Ok((bytes, cleared, false, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_a_file() {
        let ec = Layout {
            stripe_unit: 4096,
            stripe_count: 6,
            servers: (0..6).collect(),
            redundancy: DataRedundancy::Ec { k: 4, m: 2 },
            generation: 0,
        };
        assert_eq!(rows_in_file(&ec, 0), 0);
        assert_eq!(rows_in_file(&ec, 1), 1);
        assert_eq!(rows_in_file(&ec, 16384), 1);
        assert_eq!(rows_in_file(&ec, 16385), 2);
        let mirror = Layout {
            stripe_unit: 4096,
            stripe_count: 2,
            servers: vec![0, 1],
            redundancy: DataRedundancy::Mirror { n: 2 },
            generation: 0,
        };
        assert_eq!(rows_in_file(&mirror, 8193), 3);
    }
}
