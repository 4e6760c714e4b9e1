//! `weft bench meta --failover`: how long clients wait when a metadata service dies (issue 29's "failover time").
//!
//! Per run: `n` clients, every one starting at the victim service (so every one has to move), create files in
//! their own directories one at a time. Once each has a few hundred creates behind it, the victim is killed
//! with SIGKILL. A client's failover time is from the kill to the end of its first create *issued* after the
//! kill: an operation blocked across the failover ends no earlier, so the next one measures the whole wait.
//! Then every directory is listed and must hold exactly the acknowledged creates (none lost, none doubled), and
//! the victim is restarted. Run `r` kills service `r mod services`, so every service is killed in turn.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use weft_client::Client;

use crate::common::{Target, round1};
use crate::stats::{percentile, summarize};

/// Creates each client completes before the kill (sessions open, the service's caches warm).
const WARM_CREATES: u64 = 200;
/// How long a run waits for every client to complete an operation after the kill before it gives up: the
/// clients' own `mds_failover_timeout_ms` (a minute by default) plus slack.
const SETTLE_MS_MAX: u64 = 90_000;

/// What one client saw in one run.
#[derive(Debug, Default)]
struct ClientRun {
    acknowledged: u64,
    errors: u64,
    first_error: Option<String>,
    /// The first create issued after the kill: (issued, ended).
    first_after: Option<(Instant, Instant)>,
}

/// The figure of one run: each client's failover time, ms, from `kill`, given each client's first operation
/// issued after the kill as (issued, ended). `None` where a client completed no such operation.
fn failover_ms(kill: Instant, first_after: &[Option<(Instant, Instant)>]) -> Vec<Option<f64>> {
    first_after
        .iter()
        .map(|op| {
            op.map(|(issued, ended)| {
                assert!(issued >= kill && ended >= issued, "an operation issued after the kill ends after it");
                (ended - kill).as_secs_f64() * 1e3
            })
        })
        .collect()
}

/// Shared between the run and its clients.
struct Shared {
    kill: OnceLock<Instant>,
    stop: AtomicBool,
    creates: AtomicU64,
    /// Clients with a completed operation issued after the kill.
    moved: AtomicUsize,
}

/// One client: creates `f0`, `f1`, … in `dir` until told to stop.
async fn client_loop(c: Client, dir: u64, shared: Arc<Shared>) -> ClientRun {
    let mut run = ClientRun::default();
    for k in 0u64.. {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let issued = Instant::now();
        let r = c.create(dir, &format!("f{k}"), 0o644, true).await;
        let ended = Instant::now();
        match r {
            Ok(_) => run.acknowledged += 1,
            Err(e) => {
                run.errors += 1;
                run.first_error.get_or_insert_with(|| format!("create f{k}: {e}"));
            }
        }
        shared.creates.fetch_add(1, Ordering::Relaxed);
        let after_kill = shared.kill.get().is_some_and(|&kill| issued >= kill);
        if after_kill && run.first_after.is_none() {
            run.first_after = Some((issued, ended));
            shared.moved.fetch_add(1, Ordering::AcqRel);
        }
    }
    run
}

/// Clients whose address lists start at service `victim` (then the others, in order).
async fn clients_at(target: &Target, n: usize, victim: usize) -> Result<Vec<Client>> {
    let mut cfg = target.cfg.clone();
    cfg.mds = crate::common::starting_at(&target.cfg.mds, victim);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(Client::connect(&cfg).await?);
    }
    Ok(v)
}

/// Polls `done` every 10 ms until it holds or `limit_ms` passes; false on the limit.
async fn wait_for(limit_ms: u64, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_millis(limit_ms);
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// One run: kill service `victim` under `n` creating clients; the moment of the kill and each client's outcome.
async fn one_run(target: &mut Target, n: usize, victim: usize, run: usize) -> Result<(Instant, Vec<ClientRun>)> {
    let clients = clients_at(target, n, victim).await?;
    let c0 = &clients[0];
    let root = c0.resolve("/").await?.ino;
    let top = c0.mkdir(root, &format!("failover-{}-{run}", std::process::id()), 0o755).await?.ino;
    let mut dirs = Vec::with_capacity(n);
    for i in 0..n {
        dirs.push(c0.mkdir(top, &format!("c{i}"), 0o755).await?.ino);
    }
    let shared = Arc::new(Shared {
        kill: OnceLock::new(),
        stop: AtomicBool::new(false),
        creates: AtomicU64::new(0),
        moved: AtomicUsize::new(0),
    });
    let tasks: Vec<_> =
        clients.iter().zip(&dirs).map(|(c, &d)| tokio::spawn(client_loop(c.clone(), d, shared.clone()))).collect();
    let warm = WARM_CREATES * n as u64;
    if !wait_for(SETTLE_MS_MAX, || shared.creates.load(Ordering::Relaxed) >= warm).await {
        bail!("run {run}: the clients did not complete {warm} creates before the kill");
    }
    let cluster = target.cluster_mut().context("--failover needs a cluster the bench starts")?;
    shared.kill.set(Instant::now()).expect("one kill per run");
    cluster.kill_meta_service(victim).await;
    let settled = wait_for(SETTLE_MS_MAX, || shared.moved.load(Ordering::Acquire) == n).await;
    shared.stop.store(true, Ordering::Release);
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.context("a client task panicked")?);
    }
    if !settled {
        bail!("run {run}: clients still had no reply {SETTLE_MS_MAX} ms after service {victim} was killed");
    }
    check_listings(c0, &dirs, &out, run).await?;
    for c in &clients {
        c.close().await;
    }
    cluster.restart_meta_service(victim).await.with_context(|| format!("restarting service {victim}"))?;
    Ok((*shared.kill.get().expect("set above"), out))
}

/// Every client's directory holds exactly its acknowledged creates when it saw no error (exactly-once: a create
/// retried at the survivor is not applied twice, and none acknowledged is lost).
async fn check_listings(c: &Client, dirs: &[u64], runs: &[ClientRun], run: usize) -> Result<()> {
    for (i, (&dir, r)) in dirs.iter().zip(runs).enumerate() {
        let listed = c.readdir(dir).await.with_context(|| format!("run {run}: listing client {i}'s files"))?.len();
        if r.errors == 0 && listed as u64 != r.acknowledged {
            bail!("run {run}: client {i} was acknowledged {} creates but its directory lists {listed}", r.acknowledged);
        }
    }
    Ok(())
}

/// `--failover` on one cluster of `services` metadata services: `runs` kills; one result row.
pub(crate) async fn measure(target: &mut Target, n: usize, services: u32, runs: usize) -> Result<Value> {
    if services < 2 {
        bail!("--failover needs --meta postgres --meta-services 2 or more: with one service there is none to move to");
    }
    let (mut all_ms, mut p99s, mut errors, mut acknowledged, mut first_error) = (vec![], vec![], 0, 0, None);
    for run in 0..runs {
        let victim = run % services as usize;
        let (kill, outcome) = one_run(target, n, victim, run).await?;
        let first_after: Vec<_> = outcome.iter().map(|r| r.first_after).collect();
        let ms: Vec<f64> = failover_ms(kill, &first_after).into_iter().flatten().collect();
        eprintln!(
            "failover run {run} (service {victim} killed): p50 {:.0} ms, max {:.0} ms over {n} clients",
            percentile(&ms, 50.0).unwrap_or(f64::NAN),
            ms.iter().copied().fold(0.0, f64::max)
        );
        p99s.push(percentile(&ms, 99.0).context("no client measured")?);
        all_ms.extend(ms);
        for r in outcome {
            errors += r.errors;
            acknowledged += r.acknowledged;
            first_error = first_error.or(r.first_error);
        }
    }
    let per_run = summarize(&p99s).context("no run")?;
    Ok(json!({
        "system": "weft",
        "op": "failover",
        "servers": target.servers,
        "clients": n,
        "meta_services": services,
        "runs": runs,
        "failover_ms_p50": round1(percentile(&all_ms, 50.0).unwrap_or(0.0)),
        "failover_ms_p99": round1(percentile(&all_ms, 99.0).unwrap_or(0.0)),
        "failover_ms_max": round1(all_ms.iter().copied().fold(0.0, f64::max)),
        "p99_ms_per_run": p99s.iter().map(|&x| round1(x)).collect::<Vec<_>>(),
        "median": round1(per_run.median),
        "min": round1(per_run.min),
        "max": round1(per_run.max),
        "acknowledged": acknowledged,
        "errors_to_the_application": errors,
        "first_error": first_error,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failover_time_runs_from_the_kill_to_the_end_of_the_first_operation_issued_after_it() {
        let kill = Instant::now();
        let at = |ms: u64| kill + Duration::from_millis(ms);
        let ms = failover_ms(kill, &[Some((at(0), at(1_500))), Some((at(2_000), at(2_010))), None]);
        assert_eq!(ms.len(), 3);
        assert!((ms[0].unwrap() - 1_500.0).abs() < 1e-6);
        assert!((ms[1].unwrap() - 2_010.0).abs() < 1e-6);
        assert_eq!(ms[2], None);
    }

    #[test]
    #[should_panic(expected = "issued after the kill")]
    fn an_operation_issued_before_the_kill_is_refused() {
        let kill = Instant::now() + Duration::from_millis(5);
        failover_ms(kill, &[Some((kill - Duration::from_millis(1), kill))]);
    }
}
