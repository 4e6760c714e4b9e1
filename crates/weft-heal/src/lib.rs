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
//! Fast: a batch is a run of rows healed with one `ReadRows` per chunk and one compare-and-set `WriteRows` per
//! written chunk (each cut into transfer units, a few in flight), and an entry keeps several batches in flight,
//! cleared in order from the front as they complete. A row another writer moves under the heal makes its batch
//! retry, then heal row by row: never overwritten, at worst left stale for the next pass.
//!
//! Bounded: at most `concurrency` entries are healed at once; batches in flight over all of them at most
//! `batches_in_flight` (each at most `batch_bytes_max` of chunks read: the memory a pass holds). Throughput is
//! held under `rebuild_mib_per_s` by a token bucket ([`TokenBucket`]: over any window of `t` seconds at most a
//! quarter second's worth plus `t` seconds' worth is written; 0: unthrottled). A pass that failed
//! (a server still unreachable, an MDS error) is retried after a backoff doubling from `retry_first_ms` up to
//! `retry_max_ms`; an idle healer wakes every `interval_ms`, or at once on `HealNow` (`weft heal --now`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
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
    /// Most bytes of chunks one batch reads (`rows × unit × width`).
    pub batch_bytes_max: u64,
    /// Batches in flight at once over the whole pass (at least 1): with `batch_bytes_max`, the memory it holds.
    pub batches_in_flight: usize,
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
            batches_in_flight: 8,
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

/// A token bucket: `bytes_per_s` tokens a second, at most `burst_bytes` saved up. A take may overdraw it (a batch
/// larger than what is saved) and its taker then waits until the debt is paid, as does every later taker: so over
/// any window of `t` seconds, the bytes that start being written are at most `burst_bytes + t × bytes_per_s`
/// plus the one take in progress. `bytes_per_s == 0`: unthrottled.
pub struct TokenBucket {
    bytes_per_s: u64,
    burst_bytes: u64,
    /// Tokens (negative: debt) as of the instant.
    state: std::sync::Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(bytes_per_s: u64, burst_bytes: u64, now: Instant) -> TokenBucket {
        TokenBucket { bytes_per_s, burst_bytes, state: std::sync::Mutex::new((burst_bytes as f64, now)) }
    }

    /// The bucket `rebuild_mib_per_s` makes: a quarter second's worth of burst.
    fn for_rate(bytes_per_s: u64) -> TokenBucket {
        TokenBucket::new(bytes_per_s, (bytes_per_s / 4).max(1), Instant::now())
    }

    /// Takes `n` tokens at `now`: how long the taker waits before writing them (zero when they were there).
    pub fn take_at(&self, n: u64, now: Instant) -> Duration {
        if self.bytes_per_s == 0 {
            return Duration::ZERO;
        }
        let rate = self.bytes_per_s as f64;
        let mut g = self.state.lock().expect("token bucket");
        let (tokens, last) = *g;
        // Time never runs backwards for the bucket (takers may pass instants out of order).
        let now = now.max(last);
        let tokens = (tokens + now.duration_since(last).as_secs_f64() * rate).min(self.burst_bytes as f64) - n as f64;
        *g = (tokens, now);
        if tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-tokens / rate) }
    }

    /// Takes `n` tokens and waits until they may be written.
    async fn take(&self, n: u64) {
        let wait = self.take_at(n, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Rows `[start, stop)` cut into batches of at most `per` rows: `(first_row, rows)` each, in order.
fn batches(start: u64, stop: u64, per: u64) -> Vec<(u64, u64)> {
    let per = per.max(1);
    let mut out = Vec::new();
    let mut at = start;
    while at < stop {
        let n = per.min(stop - at);
        out.push((at, n));
        at += n;
    }
    out
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
        self.run_while(|| true).await
    }

    /// [`Healer::run`], making a pass only while `may_act()` (the service beside it holds the duty lease, so one
    /// healer works on a cluster with several metadata services); otherwise it waits for the interval or a nudge.
    pub async fn run_while(self, may_act: impl Fn() -> bool) {
        let mut backoff_ms = self.cfg.retry_first_ms.max(1);
        loop {
            if !may_act() {
                tokio::select! {
                    _ = self.state.nudge.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(self.cfg.interval_ms)) => {}
                }
                continue;
            }
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
        let throttle = Arc::new(TokenBucket::for_rate(self.cfg.rebuild_mib_per_s.saturating_mul(1 << 20)));
        let inflight = Arc::new(tokio::sync::Semaphore::new(self.cfg.batches_in_flight.max(1)));
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
                let (me, throttle, up, inflight) = (me.clone(), throttle.clone(), up.clone(), inflight.clone());
                tasks.spawn(async move { me.heal_entry(&e, &up, &throttle, &inflight).await });
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
    async fn heal_entry(
        &self,
        e: &StaleEntry,
        up: &[u32],
        throttle: &Arc<TokenBucket>,
        inflight: &Arc<Semaphore>,
    ) -> EntryOutcome {
        match self.try_heal_entry(e, up, throttle, inflight).await {
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
        throttle: &Arc<TokenBucket>,
        inflight: &Arc<Semaphore>,
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
        let file = Arc::new(file);
        let (mut bytes, mut cleared) = (0u64, 0u64);
        for r in &e.ranges {
            // A whole slot ends with the file. A marked range is healed whole, even past the committed size: a
            // degraded write's rows are there until its writer commits, and its bytes are on the other servers.
            let (stop, cut) = if r.end == u64::MAX {
                (rows.max(r.start), size)
            } else {
                (r.end, size.max(r.end.saturating_mul(row_bytes(&layout))))
            };
            let batches = batches(r.start, stop, batch_rows);
            let (written, done) =
                self.heal_batches(e, &file, (r.start, &batches), r.seq, cut, unit, throttle, inflight).await;
            bytes += written;
            let at = match done? {
                Some(at) => at,
                // Marked again while we copied: the next pass heals it under its new seq.
                None => {
                    tracing::info!(ino = e.ino, slot, server, "stale range marked again during its heal");
                    continue;
                }
            };
            // A whole slot's rows past the file's end hold nothing: its tail goes without copying.
            if at < r.end {
                let req = ClearStaleReq { ino: e.ino, slot: e.slot, start: at, end: r.end, seq: r.seq };
                if !self.client.clear_stale(req).await? {
                    continue;
                }
            }
            cleared += 1;
            tracing::info!(ino = e.ino, slot, server, start = r.start, end = r.end, "healed a stale range");
        }
        Ok((bytes, cleared, false, false))
    }

    /// Heals `batches` (in order, `(first_row, rows)`) of one stale range of `seq`, several in flight, clearing
    /// each from the range's front as soon as it and every one before it are healed. Returns the bytes written
    /// and the row the range is cleared up to (`None`: it was marked again meanwhile, the rest is left to the
    /// next pass), or the first error (batches after it stay stale).
    #[allow(clippy::too_many_arguments)]
    async fn heal_batches(
        &self,
        e: &StaleEntry,
        file: &Arc<weft_client::File>,
        (start, batches): (u64, &[(u64, u64)]),
        seq: u64,
        cut: u64,
        unit: u64,
        throttle: &Arc<TokenBucket>,
        inflight: &Arc<Semaphore>,
    ) -> (u64, Result<Option<u64>, ClientError>) {
        let slot = e.slot as usize;
        let mut tasks: tokio::task::JoinSet<(usize, Result<u64, ClientError>)> = tokio::task::JoinSet::new();
        let mut done: Vec<bool> = vec![false; batches.len()];
        let (mut next_clear, mut bytes) = (0usize, 0u64);
        let mut outcome: Result<Option<u64>, ClientError> = Ok(None);
        let mut stopped = false;
        let mut issued = 0usize;
        while next_clear < batches.len() && !stopped {
            // Issue while a permit is free (and always keep one batch going).
            while issued < batches.len() && (tasks.is_empty() || inflight.available_permits() > 0) {
                let permit = inflight.clone().acquire_owned().await.expect("never closed");
                let (first, n) = batches[issued];
                throttle.take(n * unit).await;
                let (file, i) = (file.clone(), issued);
                tasks.spawn(async move {
                    let r = weft_client::heal_rows(&file, slot, first, n, cut).await;
                    drop(permit);
                    (i, r)
                });
                issued += 1;
            }
            let Some(j) = tasks.join_next().await else { break };
            match j {
                Ok((i, Ok(n))) => {
                    bytes += n;
                    done[i] = true;
                }
                Ok((_, Err(err))) => {
                    outcome = Err(err);
                    stopped = true;
                }
                Err(err) => {
                    outcome = Err(ClientError::Protocol(format!("heal task failed: {err}")));
                    stopped = true;
                }
            }
            // Clear from the front what is healed.
            while !stopped && next_clear < batches.len() && done[next_clear] {
                let (first, n) = batches[next_clear];
                let req = ClearStaleReq { ino: e.ino, slot: e.slot, start: first, end: first + n, seq };
                match self.client.clear_stale(req).await {
                    Ok(true) => next_clear += 1,
                    Ok(false) => stopped = true,
                    Err(err) => {
                        outcome = Err(err);
                        stopped = true;
                    }
                }
            }
        }
        // Batches still in flight finish (a heal is never cut half-way); their rows stay stale if not cleared.
        while let Some(j) = tasks.join_next().await {
            if let Ok((_, Ok(n))) = j {
                bytes += n;
            }
        }
        if outcome.is_ok() && !stopped {
            let at = batches.last().map_or(start, |&(f, n)| f + n);
            outcome = Ok(Some(at));
        }
        (bytes, outcome)
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

    #[test]
    fn a_range_is_cut_into_batches_at_the_bound_in_order() {
        assert_eq!(batches(5, 5, 3), vec![]);
        assert_eq!(batches(0, 7, 3), vec![(0, 3), (3, 3), (6, 1)]);
        assert_eq!(batches(10, 16, 3), vec![(10, 3), (13, 3)]);
        // A bound of 0 rows still makes progress, one row a batch.
        assert_eq!(batches(0, 2, 0), vec![(0, 1), (1, 1)]);
        // The batches cover the range exactly once, whatever the bound.
        for per in 1..20 {
            let b = batches(3, 100, per);
            assert!(b.iter().all(|&(_, n)| n >= 1 && n <= per));
            let mut at = 3;
            for &(f, n) in &b {
                assert_eq!(f, at);
                at += n;
            }
            assert_eq!(at, 100);
        }
    }

    #[test]
    fn the_token_bucket_holds_the_rate_over_any_window() {
        let t0 = Instant::now();
        let s = |ms: u64| t0 + Duration::from_millis(ms);
        let b = TokenBucket::new(1000, 500, t0);
        // The saved burst goes at once; then every taker waits for its share, debts queued in order.
        assert_eq!(b.take_at(500, s(0)), Duration::ZERO);
        assert_eq!(b.take_at(250, s(0)), Duration::from_millis(250));
        assert_eq!(b.take_at(250, s(0)), Duration::from_millis(500));
        // Half a second later the debt is paid: nothing is saved yet.
        assert_eq!(b.take_at(100, s(500)), Duration::from_millis(100));
        // A long idle spell saves at most the burst.
        assert_eq!(b.take_at(500, s(10_000)), Duration::ZERO);
        assert_eq!(b.take_at(1, s(10_000)), Duration::from_millis(1));
        // An instant before the last one counts as the last one.
        assert_eq!(b.take_at(9, s(5_000)), Duration::from_millis(10));

        // Seeded takers of random sizes that each start writing when told: over every window, what started is at
        // most the burst plus the window's worth plus one take.
        let b = TokenBucket::new(1 << 20, 256 << 10, t0);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut now = t0;
        let mut starts: Vec<(Instant, u64)> = Vec::new();
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = x % (192 << 10) + 1;
            // A taker arrives up to 50 ms after the previous one started.
            now += Duration::from_micros(x % 50_000);
            let wait = b.take_at(n, now);
            now += wait;
            starts.push((now, n));
        }
        for i in 0..starts.len() {
            let mut sum = 0u64;
            for &(t, n) in &starts[i..] {
                sum += n;
                let window = t.duration_since(starts[i].0).as_secs_f64();
                let most = (256 << 10) as f64 + window * (1 << 20) as f64 + (192 << 10) as f64;
                assert!((sum as f64) <= most + 1.0, "{sum} bytes started in {window} s");
            }
        }
        // Unthrottled: never waits.
        let b = TokenBucket::new(0, 0, t0);
        assert_eq!(b.take_at(u64::MAX, t0), Duration::ZERO);
    }
}
